//! Times each target's driver over a directory of inputs (default: its seeds), without
//! sanitizers: `cargo run --release --example time_seeds [TARGET [DIR]]`.
use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let targets = [
        "http_sse",
        "jsonrpc_mcp",
        "pipeline_capture",
        "pipeline_frames",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for t in targets {
        if args.first().is_some_and(|a| a != t) {
            continue;
        }
        let dir = args.get(1).map_or(root.join("seeds").join(t), |d| d.into());
        let run: fn(&[u8]) -> usize = match t {
            "pipeline_capture" => mcptap_fuzz::run_capture,
            "pipeline_frames" => mcptap_fuzz::run_frames,
            "http_sse" => mcptap_fuzz::run_http,
            _ => mcptap_fuzz::run_mcp,
        };
        let inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| std::fs::read(e.expect("entry").path()).expect("read"))
            .collect();
        let start = Instant::now();
        let mut events = 0;
        for i in &inputs {
            events += run(i);
        }
        let el = start.elapsed();
        println!(
            "{t}: {} inputs, {events} events, {:.3} ms per input",
            inputs.len(),
            el.as_secs_f64() * 1000.0 / inputs.len().max(1) as f64
        );
    }
}
