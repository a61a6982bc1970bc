//! Lineage: which ended session a new one continues. A client whose session was rejected,
//! expired or deleted usually starts over in a new one; its first handshake is linked to the
//! predecessor so that what it lost across the two shows up.

use super::session::{CapsRecord, SessionKey};
use crate::model::Timestamp;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

/// A session that was rejected, expired or deleted: a possible predecessor of the next one.
#[derive(Debug, Clone)]
pub struct Ended {
    pub ts: Timestamp,
    pub server: SocketAddr,
    pub client_ip: IpAddr,
    pub client_info: Box<str>,
    pub session_id: String,
    pub baseline: Option<CapsRecord>,
}

/// Most ended sessions remembered at once.
const MAX_ENDED: usize = 4096;

/// Recently ended sessions, oldest first.
#[derive(Debug, Default)]
pub struct Lineage {
    ended: VecDeque<Ended>,
}

impl Lineage {
    /// Remembers an ended session, replacing an earlier record of the same session.
    pub fn remember(&mut self, key: &SessionKey, record: Ended) {
        self.ended
            .retain(|e| !(e.server == key.0 && e.session_id == key.1));
        if self.ended.len() >= MAX_ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(record);
    }

    /// The most recent ended session of the same client (address and clientInfo) on `server`
    /// within `window_ns` of `now`, other than `sid` itself.
    pub fn predecessor(
        &self,
        server: SocketAddr,
        client_ip: IpAddr,
        client_info: &str,
        sid: &str,
        now: Timestamp,
        window_ns: i64,
    ) -> Option<&Ended> {
        self.ended.iter().rev().find(|e| {
            e.server == server
                && e.client_ip == client_ip
                && e.session_id != sid
                && &*e.client_info == client_info
                && now.0.saturating_sub(e.ts.0) <= window_ns
        })
    }

    /// Forgets sessions that ended longer than `window_ns` ago.
    pub fn expire(&mut self, now: Timestamp, window_ns: i64) {
        while self
            .ended
            .front()
            .is_some_and(|e| now.0.saturating_sub(e.ts.0) > window_ns)
        {
            self.ended.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(sid: &str, ts: i64) -> Ended {
        Ended {
            ts: Timestamp(ts),
            server: "127.0.0.2:80".parse().expect("addr"),
            client_ip: "127.0.0.3".parse().expect("addr"),
            client_info: Box::from(r#"{"name":"a"}"#),
            session_id: sid.to_string(),
            baseline: None,
        }
    }

    #[test]
    fn the_most_recent_matching_session_within_the_window_is_the_predecessor() {
        let mut l = Lineage::default();
        let server = "127.0.0.2:80".parse().expect("addr");
        let ip = "127.0.0.3".parse().expect("addr");
        for (sid, ts) in [("a", 10), ("b", 20)] {
            l.remember(&(server, sid.to_string()), ended(sid, ts));
        }
        let found = |l: &Lineage, info: &str, sid: &str, now: i64| {
            l.predecessor(server, ip, info, sid, Timestamp(now), 100)
                .map(|e| e.session_id.clone())
        };
        assert_eq!(found(&l, r#"{"name":"a"}"#, "c", 30), Some("b".into()));
        // Not itself, not another client, not beyond the window.
        assert_eq!(found(&l, r#"{"name":"a"}"#, "b", 30), Some("a".into()));
        assert_eq!(found(&l, r#"{"name":"z"}"#, "c", 30), None);
        assert_eq!(found(&l, r#"{"name":"a"}"#, "c", 500), None);
        l.expire(Timestamp(115), 100);
        assert_eq!(found(&l, r#"{"name":"a"}"#, "b", 115), None);
    }
}
