//! Redaction (`[privacy] redact = ["client_ip", "client_info"]`): client addresses and
//! clientInfo are emitted and stored as keyed hashes (HMAC-SHA-256 under `redact_key_file`).
//! A redacted address keeps its type and port: `fd6d:6370:` followed by 96 bits of the hash, so
//! one client stays one (pseudonymous) client across events, hosts sharing the key and restarts.

use mcptap_core::mcp::identity::hmac_sha256;
use mcptap_core::model::{Event, Output, SharedJson};
use serde_json::Value;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The `[privacy]` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrivacySettings {
    /// What to redact: `client_ip`, `client_info`.
    pub redact: Vec<String>,
    /// The HMAC key (at least 16 bytes); the same on every host of a fleet.
    pub redact_key_file: Option<String>,
}

/// The prefix of redacted addresses (`fd6d:6370::/32`: "mcp" in a unique-local range).
const PREFIX: [u8; 4] = [0xfd, 0x6d, 0x63, 0x70];

#[derive(Clone)]
pub struct Redactor {
    key: Vec<u8>,
    client_ip: bool,
    client_info: bool,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("client_ip", &self.client_ip)
            .field("client_info", &self.client_info)
            .finish_non_exhaustive()
    }
}

impl Redactor {
    /// `None` when nothing is to be redacted.
    pub fn from_settings(p: &PrivacySettings) -> Result<Option<Redactor>, String> {
        if p.redact.is_empty() {
            return Ok(None);
        }
        let mut client_ip = false;
        let mut client_info = false;
        for r in &p.redact {
            match r.as_str() {
                "client_ip" => client_ip = true,
                "client_info" => client_info = true,
                other => {
                    return Err(format!(
                        "privacy.redact: unknown field {other} (client_ip, client_info)"
                    ));
                }
            }
        }
        let path = p
            .redact_key_file
            .as_deref()
            .ok_or("privacy.redact needs privacy.redact_key_file")?;
        let key =
            std::fs::read(path).map_err(|e| format!("privacy.redact_key_file {path}: {e}"))?;
        if key.len() < 16 {
            return Err(format!(
                "privacy.redact_key_file {path}: at least 16 bytes of key are needed"
            ));
        }
        Ok(Some(Redactor {
            key,
            client_ip,
            client_info,
        }))
    }

    /// The key lineage ids are hashed with.
    pub fn key(&self) -> Vec<u8> {
        self.key.clone()
    }

    pub fn addr(&self, a: SocketAddr) -> SocketAddr {
        if !self.client_ip {
            return a;
        }
        if let IpAddr::V6(v6) = a.ip()
            && v6.octets()[..4] == PREFIX
        {
            return a; // already redacted (a restored or shared record)
        }
        let ip = match a.ip() {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        let mac = hmac_sha256(&self.key, &ip);
        let mut octets = [0u8; 16];
        octets[..4].copy_from_slice(&PREFIX);
        octets[4..].copy_from_slice(&mac[..12]);
        SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), a.port())
    }

    /// Replaces the value (shared with the session layer's cache of handshake readings, which
    /// keeps its own) by its keyed hash.
    fn info(&self, v: &mut SharedJson) {
        if !self.client_info || v.is_null() || v.get("redacted").is_some() {
            return;
        }
        let mac = hmac_sha256(&self.key, v.text().as_bytes());
        let hex: String = mac[..8].iter().map(|b| format!("{b:02x}")).collect();
        *v = SharedJson::new(serde_json::json!({ "redacted": hex }));
    }

    pub fn event(&self, ev: &mut Event) {
        match ev {
            Event::Handshake(h) => {
                h.client = self.addr(h.client);
                self.info(&mut h.client_info);
            }
            Event::Alert(a) => a.client = self.addr(a.client),
            Event::Exchange(x) => x.client = self.addr(x.client),
            Event::SessionEnd(_) => {}
        }
    }

    pub fn outputs(&self, outputs: &mut [Output]) {
        for o in outputs {
            if let Output::Event(ev) = o {
                self.event(ev);
            }
        }
    }

    /// A stored record (snapshot entry or fleet record, JSON): its `client` address.
    pub fn record(&self, json: &str) -> String {
        let Ok(mut v) = serde_json::from_str::<Value>(json) else {
            return json.to_string();
        };
        if let Some(c) = v.get_mut("client")
            && let Some(a) = c.as_str().and_then(|s| s.parse::<SocketAddr>().ok())
        {
            *c = Value::from(self.addr(a).to_string());
        }
        serde_json::to_string(&v).unwrap_or_else(|_| json.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor {
            key: b"0123456789abcdef".to_vec(),
            client_ip: true,
            client_info: true,
        }
    }

    #[test]
    fn addresses_become_stable_pseudonyms_and_stay_so() {
        let r = redactor();
        let a: SocketAddr = "127.0.9.1:4000".parse().unwrap();
        let x = r.addr(a);
        assert_eq!(x.port(), 4000);
        assert!(x.to_string().starts_with("[fd6d:6370:"), "{x}");
        assert_eq!(r.addr(a), x);
        assert_eq!(r.addr(x), x, "redacting twice changes nothing");
        assert_ne!(r.addr("127.0.9.2:4000".parse().unwrap()).ip(), x.ip());
        let mut info = SharedJson::new(serde_json::json!({"name": "agent", "version": "1"}));
        let shared = info.clone();
        r.info(&mut info);
        // A value shared with another holder is replaced here, not changed there.
        assert_eq!(
            *shared,
            serde_json::json!({"name": "agent", "version": "1"})
        );
        assert!(info["redacted"].is_string());
        let before = info.clone();
        r.info(&mut info);
        assert_eq!(info, before);
    }

    #[test]
    fn settings_are_checked() {
        let bad = PrivacySettings {
            redact: vec!["client_ip".into()],
            redact_key_file: None,
        };
        assert!(Redactor::from_settings(&bad).is_err());
        let unknown = PrivacySettings {
            redact: vec!["session_id".into()],
            redact_key_file: Some("/dev/null".into()),
        };
        assert!(Redactor::from_settings(&unknown).is_err());
        assert!(
            Redactor::from_settings(&PrivacySettings::default())
                .unwrap()
                .is_none()
        );
    }
}
