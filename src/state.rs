//! The snapshot file: the session layer's lasting state (baselines, handshake sequence numbers,
//! response modes, modern declarations, lineage records) written on SIGTERM and every
//! `snapshot_interval_secs`, loaded at start, so that a restart in the middle of a session
//! keeps its baseline. Written atomically (a temporary file, fsync, rename), readable by root
//! only; a snapshot of an unknown version or that does not parse is refused and counted.

use mcptap_core::detect::ModeTracker;
use mcptap_core::mcp::snapshot::{SNAPSHOT_VERSION, StateSnapshot};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub type Snapshot = StateSnapshot<ModeTracker>;

/// Largest snapshot file read (a snapshot holds at most the session budget's worth of state).
const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Why a snapshot was not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    Io(String),
    /// Not a snapshot, or a corrupt one.
    Garbage(String),
    /// A snapshot of another format version.
    Version(u32),
}

impl LoadError {
    pub fn label(&self) -> &'static str {
        match self {
            LoadError::Io(_) => "io",
            LoadError::Garbage(_) => "garbage",
            LoadError::Version(_) => "version",
        }
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io(e) => write!(f, "cannot read: {e}"),
            LoadError::Garbage(e) => write!(f, "not a snapshot: {e}"),
            LoadError::Version(v) => write!(
                f,
                "snapshot format version {v}, this mcptap reads {SNAPSHOT_VERSION}"
            ),
        }
    }
}

/// Reads a snapshot; `Ok(None)` when there is none yet.
pub fn load(path: &Path) -> Result<Option<Snapshot>, LoadError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LoadError::Io(e.to_string())),
    };
    let mut text = String::new();
    use std::io::Read;
    file.take(MAX_SNAPSHOT_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| LoadError::Garbage(e.to_string()))?;
    #[derive(serde::Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version =
        serde_json::from_str(&text).map_err(|e| LoadError::Garbage(e.to_string()))?;
    if !Snapshot::reads_version(version.v) {
        return Err(LoadError::Version(version.v));
    }
    let mut snapshot: Snapshot =
        serde_json::from_str(&text).map_err(|e| LoadError::Garbage(e.to_string()))?;
    snapshot.upgrade();
    Ok(Some(snapshot))
}

/// Writes `snapshot` to `path` atomically: readers see the old file or the new one, whole.
pub fn save(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let tmp = path.with_extension("tmp");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut w = std::io::BufWriter::new(&mut f);
        serde_json::to_writer(&mut w, snapshot)?;
        w.flush()?;
        drop(w);
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(d) = dir
        && let Ok(d) = std::fs::File::open(d)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Where pipeline workers leave their part of a periodic snapshot.
#[derive(Debug, Default)]
pub struct SnapshotSlots {
    requested: AtomicU64,
    slots: Mutex<Vec<(u64, Option<Snapshot>)>>,
}

impl SnapshotSlots {
    pub fn new(workers: usize) -> Self {
        SnapshotSlots {
            requested: AtomicU64::new(0),
            slots: Mutex::new((0..workers).map(|_| (0, None)).collect()),
        }
    }

    /// Asks every worker for its part; returns the request's generation.
    pub fn request(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The generation a worker should answer, if it has not yet.
    pub fn pending(&self, answered: u64) -> Option<u64> {
        let want = self.requested.load(Ordering::SeqCst);
        (want > answered).then_some(want)
    }

    pub fn answer(&self, worker: usize, generation: u64, part: Snapshot) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get_mut(worker) {
            *slot = (generation, Some(part));
        }
    }

    /// Every worker's part of `generation`, merged, once all have answered.
    pub fn collect(&self, generation: u64) -> Option<Snapshot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.iter().any(|(g, _)| *g < generation) {
            return None;
        }
        let mut all = Snapshot::default();
        for (_, part) in slots.iter_mut() {
            if let Some(p) = part.take() {
                all.merge(p);
            }
        }
        Some(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_and_refusals() {
        let dir = std::env::temp_dir().join(format!("mcptap-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        assert!(matches!(load(&path), Ok(None)));
        save(&path, &Snapshot::default()).unwrap();
        let back = load(&path).unwrap().unwrap();
        assert_eq!(back.v, SNAPSHOT_VERSION);
        // Version 1 files are read (their digests dropped), as the current version.
        std::fs::write(&path, r#"{"v":1,"sessions":[],"ended":[]}"#).unwrap();
        assert_eq!(load(&path).unwrap().unwrap().v, SNAPSHOT_VERSION);
        std::fs::write(&path, r#"{"v":99,"sessions":[],"ended":[]}"#).unwrap();
        assert_eq!(load(&path).unwrap_err(), LoadError::Version(99));
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(load(&path).unwrap_err().label(), "garbage");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn slots_collect_once_every_worker_answered() {
        let slots = SnapshotSlots::new(2);
        let g = slots.request();
        assert_eq!(slots.pending(0), Some(g));
        slots.answer(0, g, Snapshot::default());
        assert!(slots.collect(g).is_none());
        slots.answer(1, g, Snapshot::default());
        assert!(slots.collect(g).is_some());
        assert_eq!(slots.pending(g), None);
    }
}
