//! Buffer growth shared by the body sinks (JSON bodies, SSE events).

/// Makes room for `additional` more bytes, at least doubling (amortised like `Vec::reserve`).
/// Unlike `Vec::reserve`, which reallocates and so may copy the whole old allocation, this
/// copies only the bytes held.
pub(super) fn grow_for(buf: &mut Vec<u8>, additional: usize) {
    if buf.capacity() - buf.len() >= additional {
        return;
    }
    let size = buf
        .len()
        .saturating_add(additional)
        .max(buf.capacity().saturating_mul(2));
    let mut grown = Vec::with_capacity(size);
    grown.extend_from_slice(buf);
    *buf = grown;
}
