//! Forensics after the fact: `mcptap report` (an HTML page), `mcptap sessions` (one line per
//! session or lineage) and `mcptap show` (one timeline in the terminal). Inputs are captures or
//! NDJSON events files; both become JSON event values read by one [`model::Collector`].

pub mod load;
pub mod model;
pub mod report;
pub mod text;
pub mod timeline;

use load::ReplayOptions;
use model::{Collector, Filter, Forensics};

/// `--session` / `--lineage`: narrows what is kept to one session or lineage.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Selection {
    /// Only this session (its Mcp-Session-Id).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only this client lineage (`lineage_id`), with its sessions.
    #[arg(long, value_name = "ID")]
    pub lineage: Option<String>,
}

impl From<Selection> for Filter {
    fn from(s: Selection) -> Self {
        Filter {
            session: s.session,
            lineage: s.lineage,
            any: None,
        }
    }
}

/// What a command printed and what it has to say on standard error.
#[derive(Debug)]
pub struct Done {
    pub stdout: String,
    pub notes: Vec<String>,
}

/// Loads every input; a filter that matches nothing is an error that says so.
pub fn load_all(
    inputs: &[String],
    filter: Filter,
    detail_limit: usize,
    options: &ReplayOptions,
) -> Result<Forensics, String> {
    let mut collector =
        Collector::bounded(filter, detail_limit, options.limits.session.max_sessions);
    load::load(inputs, options, &mut collector)?;
    let f = collector.finish();
    if f.filter.is_active() && f.sessions.is_empty() {
        return Err(format!(
            "no {} in {} ({} sessions and lineages seen; `mcptap sessions` lists them)",
            f.filter.describe(),
            f.input_names(),
            f.counts.sessions
        ));
    }
    Ok(f)
}

/// Reader problems worth a line on standard error.
fn notes(f: &Forensics) -> Vec<String> {
    let mut out = Vec::new();
    for i in &f.inputs {
        if i.malformed_lines > 0 {
            out.push(format!(
                "{}: {} malformed event lines skipped ({})",
                i.name,
                i.malformed_lines,
                i.malformed_examples.join("; ")
            ));
        }
        for n in &i.notes {
            out.push(n.clone());
        }
    }
    if f.beyond_max_records > 0 {
        out.push(format!(
            "{} events of sessions and lineages beyond --max-sessions {} were counted, not listed",
            f.beyond_max_records, f.max_records
        ));
    }
    if f.counts.counts_capped {
        out.push("more distinct servers, sessions or lineages than are counted: the counts are lower bounds".into());
    }
    out
}

/// `mcptap report`: writes the page to `output`.
pub fn report(
    inputs: &[String],
    output: &str,
    selection: Selection,
    detail_sessions: usize,
    options: &ReplayOptions,
) -> Result<Done, String> {
    let f = load_all(inputs, selection.into(), detail_sessions, options)?;
    let html = report::render(&f);
    std::fs::write(output, html).map_err(|e| format!("{output}: cannot write the report: {e}"))?;
    let alerted = f.sessions.iter().filter(|s| s.total_alerts() > 0).count();
    let mut notes = notes(&f);
    notes.push(format!(
        "mcptap report: {} sessions and lineages ({alerted} alerted), {} alerts -> {output}",
        f.sessions.len(),
        f.counts.alerts.values().sum::<u64>()
    ));
    Ok(Done {
        stdout: String::new(),
        notes,
    })
}

/// `mcptap sessions`: no timelines are kept, only each session's counters.
pub fn sessions(
    inputs: &[String],
    order: text::SortOrder,
    selection: Selection,
    options: &ReplayOptions,
) -> Result<Done, String> {
    let f = load_all(inputs, selection.into(), 0, options)?;
    Ok(Done {
        stdout: text::sessions_table(&f, order),
        notes: notes(&f),
    })
}

/// `mcptap show ID`: the timeline of the sessions and lineages with that id.
pub fn show(id: &str, inputs: &[String], options: &ReplayOptions) -> Result<Done, String> {
    let filter = Filter {
        any: Some(id.to_string()),
        ..Filter::default()
    };
    let f = load_all(inputs, filter, model::DEFAULT_DETAIL_SESSIONS, options)?;
    Ok(Done {
        stdout: text::show(&f),
        notes: notes(&f),
    })
}
