//! The structural invariants of the HTTP event stream that the session layer relies on.

use std::collections::HashMap;

use mcptap_core::http::HttpEvent;

/// Checks, per exchange, at most one response head and one end, and response bodies only
/// between the two. Feed it every batch of events one connection produces, in order.
#[derive(Debug, Default, Clone)]
pub struct HttpEventChecker {
    /// Per exchange: (head seen, end seen).
    exchanges: HashMap<u64, (bool, bool)>,
}

impl HttpEventChecker {
    /// Panics (with the exchange number) at the first event that breaks an invariant.
    pub fn check(&mut self, events: &[HttpEvent]) {
        for ev in events {
            match ev {
                HttpEvent::ResponseHead { exchange, .. } => {
                    let s = self.exchanges.entry(*exchange).or_default();
                    assert!(!s.0, "second ResponseHead for exchange {exchange}");
                    s.0 = true;
                }
                HttpEvent::ResponseJson { exchange, .. }
                | HttpEvent::ResponseSse { exchange, .. } => {
                    let s = self.exchanges.get(exchange).copied().unwrap_or_default();
                    assert!(s.0, "response body before its head, exchange {exchange}");
                    assert!(!s.1, "response body after its end, exchange {exchange}");
                }
                HttpEvent::ResponseEnd { exchange, .. } => {
                    let s = self.exchanges.entry(*exchange).or_default();
                    assert!(s.0, "ResponseEnd before its head, exchange {exchange}");
                    assert!(!s.1, "second ResponseEnd for exchange {exchange}");
                    s.1 = true;
                }
                _ => {}
            }
        }
    }
}
