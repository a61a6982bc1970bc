//! Exchanges as per-flow transactions (Suricata style): each connection keeps its open
//! exchanges, bounded, and closing a connection touches only its own.

use super::session::ExchangeKey;
use crate::http::{RequestHead, ResponseHead};
use crate::jsonrpc::Id;
use crate::model::Timestamp;
use foldhash::HashMap;
use serde_json::Value;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// A JSON-RPC request carried by one HTTP request.
#[derive(Debug)]
pub struct PendingRequest {
    pub id: Id,
    pub method: String,
    pub tool: Option<String>,
    /// `initialize` params, kept for the handshake event.
    pub init_params: Option<Value>,
    pub answered: bool,
}

/// What an SSE answer carried so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamContent {
    /// Dispatched events, comments and data-less blocks.
    pub items: u32,
    /// JSON-RPC notifications or requests seen.
    pub messages: u32,
}

/// How one answer to a request was delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    Json,
    /// An SSE stream whose first JSON-RPC message is the result.
    SseResultOnly,
    /// An SSE stream in which notifications or requests came before the result.
    SseAfterMessages,
}

impl AnswerShape {
    pub fn media_type(self) -> &'static str {
        match self {
            AnswerShape::Json => "application/json",
            AnswerShape::SseResultOnly | AnswerShape::SseAfterMessages => "text/event-stream",
        }
    }
}

/// One HTTP request/response pair that may carry MCP, while it is open.
#[derive(Debug)]
pub struct ExchangeState {
    /// The request's number on its connection.
    pub number: u64,
    pub ts: Timestamp,
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub head: RequestHead,
    /// Session named by the request header, or learned from the response header.
    pub session_id: Option<String>,
    pub requests: Vec<PendingRequest>,
    pub response: Option<ResponseHead>,
    pub stream: StreamContent,
}

/// The request side of an exchange, as the handshake logic needs it.
#[derive(Debug, Clone)]
pub struct Origin {
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub head: RequestHead,
    pub session_id: Option<String>,
}

impl ExchangeState {
    pub fn origin(&self) -> Origin {
        Origin {
            client: self.client,
            server: self.server,
            head: self.head.clone(),
            session_id: self.session_id.clone(),
        }
    }
}

/// Open exchanges, per flow. Requests are numbered in order on a connection and answered in
/// order, so each flow's queue stays sorted by number.
#[derive(Debug, Default)]
pub struct Transactions {
    flows: HashMap<u64, VecDeque<ExchangeState>>,
    max_per_flow: usize,
}

impl Transactions {
    pub fn new(max_per_flow: usize) -> Self {
        Transactions {
            flows: HashMap::default(),
            max_per_flow: max_per_flow.max(1),
        }
    }

    fn position(queue: &VecDeque<ExchangeState>, number: u64) -> Option<usize> {
        queue.binary_search_by_key(&number, |ex| ex.number).ok()
    }

    pub fn get(&self, key: ExchangeKey) -> Option<&ExchangeState> {
        let queue = self.flows.get(&key.0)?;
        queue.get(Self::position(queue, key.1)?)
    }

    pub fn get_mut(&mut self, key: ExchangeKey) -> Option<&mut ExchangeState> {
        let queue = self.flows.get_mut(&key.0)?;
        let at = Self::position(queue, key.1)?;
        queue.get_mut(at)
    }

    /// Opens exchange `ex` on `flow`. Returns the oldest open exchange of that flow when the
    /// flow is over its bound, which the caller drops (and counts).
    pub fn open(&mut self, flow: u64, ex: ExchangeState) -> Option<ExchangeState> {
        let queue = self.flows.entry(flow).or_default();
        let dropped = (queue.len() >= self.max_per_flow)
            .then(|| queue.pop_front())
            .flatten();
        match queue.back() {
            Some(last) if last.number >= ex.number => {
                // Out of order (a caller reusing numbers): keep the queue sorted.
                let at = queue.partition_point(|e| e.number < ex.number);
                if queue.get(at).is_some_and(|e| e.number == ex.number) {
                    queue[at] = ex;
                } else {
                    queue.insert(at, ex);
                }
            }
            _ => queue.push_back(ex),
        }
        dropped
    }

    pub fn remove(&mut self, key: ExchangeKey) -> Option<ExchangeState> {
        let queue = self.flows.get_mut(&key.0)?;
        let ex = queue.remove(Self::position(queue, key.1)?);
        if queue.is_empty() {
            self.flows.remove(&key.0);
        }
        ex
    }

    /// The flow is gone: forget its exchanges.
    pub fn close_flow(&mut self, flow: u64) {
        self.flows.remove(&flow);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(number: u64) -> ExchangeState {
        let addr: SocketAddr = "127.0.0.2:1".parse().expect("addr");
        ExchangeState {
            number,
            ts: Timestamp(0),
            client: addr,
            server: addr,
            head: RequestHead::default(),
            session_id: None,
            requests: Vec::new(),
            response: None,
            stream: StreamContent::default(),
        }
    }

    #[test]
    fn exchanges_are_found_per_flow_and_closing_a_flow_touches_only_its_own() {
        let mut t = Transactions::new(8);
        for n in 0..3 {
            assert!(t.open(1, exchange(n)).is_none());
            assert!(t.open(2, exchange(n)).is_none());
        }
        assert_eq!(t.get((1, 2)).map(|e| e.number), Some(2));
        assert_eq!(t.remove((1, 1)).map(|e| e.number), Some(1));
        assert!(t.get((1, 1)).is_none());
        assert_eq!(t.get((1, 2)).map(|e| e.number), Some(2));
        t.close_flow(1);
        assert!(t.get((1, 0)).is_none());
        assert_eq!(t.get_mut((2, 1)).map(|e| e.number), Some(1));
    }

    #[test]
    fn a_flow_over_its_bound_gives_up_its_oldest_exchange() {
        let mut t = Transactions::new(2);
        assert!(t.open(7, exchange(10)).is_none());
        assert!(t.open(7, exchange(11)).is_none());
        assert_eq!(t.open(7, exchange(12)).map(|e| e.number), Some(10));
        assert!(t.get((7, 10)).is_none());
        assert!(t.get((7, 12)).is_some());
    }

    #[test]
    fn out_of_order_numbers_keep_the_queue_sorted() {
        let mut t = Transactions::new(8);
        t.open(1, exchange(5));
        t.open(1, exchange(3));
        t.open(1, exchange(4));
        for n in [3, 4, 5] {
            assert_eq!(t.get((1, n)).map(|e| e.number), Some(n));
        }
    }
}
