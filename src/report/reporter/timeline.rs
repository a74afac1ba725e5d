//! A picture of the run: which batch ran on which GPU when, and how long each waited
//! for its GPUs. Drawn twice from the batches' records: as a Mermaid `gantt` block in
//! `summary.md` (GitHub renders it, in the step summary too), and as `timeline.svg`
//! beside it, self-contained (no script, font or image from elsewhere), for a run
//! looked at without GitHub.
//!
//! Each batch is a row in the section of every GPU it held (`GPU 0`, …; `n1 GPU 0` for
//! a GPU of Slurm node `n1`: nodes number their GPUs alike), in `CPU` when it asked for
//! none, or in `no GPU granted` when it never got its GPUs; its wait for GPUs and its
//! run are two bars.

use std::fmt::Write as _;

use crate::report::outcome::{BatchResult, Status};
use crate::units::{human, parse_rfc3339_ms};

/// The most batches drawn; the rest are named in a note.
pub const MAX_DRAWN: usize = 200;

/// One batch's row: when it waited for its GPUs and when it ran (ms since 1970).
#[derive(Debug, Clone)]
struct Row {
    batch: String,
    status: Status,
    /// How its bar names its ending: the status, `flaky`, or `failed (soft_fail)`.
    word: String,
    /// Its bar's fill.
    fill: &'static str,
    wait: (u64, u64),
    run: (u64, u64),
}

/// A flaky pass: passed (green), striped so it never reads as simply green.
const FLAKY: &str = "url(#flaky)";

/// A section of the picture: a GPU (of a Slurm node, when the record names one), the
/// CPU batches, or the batches never granted GPUs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Gpu { node: Option<String>, index: u32 },
    Cpu,
    NoGpu,
}

impl Lane {
    fn title(&self, model: Option<&str>) -> String {
        match self {
            Lane::Gpu { node, index } => {
                let node = node.as_ref().map(|n| format!("{n} ")).unwrap_or_default();
                match model {
                    Some(m) => format!("{node}GPU {index} ({m})"),
                    None => format!("{node}GPU {index}"),
                }
            }
            Lane::Cpu => "CPU".into(),
            Lane::NoGpu => "no GPU granted".into(),
        }
    }
}

/// What is drawn: the sections in order (GPUs by node and index, then CPU, then no GPU), each
/// with its rows in the order the batches ended; the run's start and end; how many
/// batches were left out.
struct Picture {
    run: String,
    lanes: Vec<(String, Vec<Row>)>,
    start: u64,
    end: u64,
    left_out: usize,
}

impl Picture {
    fn of(results: &[BatchResult]) -> Option<Picture> {
        let mut lanes: Vec<(Lane, Option<String>, Vec<Row>)> = Vec::new();
        let mut left_out = 0;
        let (mut start, mut end) = (u64::MAX, 0);
        for (n, b) in results.iter().enumerate() {
            let r = &b.record;
            // A batch kept from starting has nothing to draw.
            if r.status == Status::NotRun {
                continue;
            }
            let Some(began) = parse_rfc3339_ms(&r.started_at) else {
                continue;
            };
            if n >= MAX_DRAWN {
                left_out += 1;
                continue;
            }
            let ms = |s: f64| (s.max(0.0) * 1000.0).round() as u64;
            let ended = began + ms(r.duration_s).max(1);
            let granted = (began + ms(r.gpu_wait_s)).min(ended);
            let (word, fill) = if r.flaky {
                ("flaky".to_string(), FLAKY)
            } else if r.soft_fail && !r.counts_against_run() && r.status != Status::Passed {
                (
                    format!("{} (soft_fail)", r.status.as_str()),
                    colour(r.status),
                )
            } else {
                (r.status.as_str().to_string(), colour(r.status))
            };
            let row = Row {
                batch: r.batch.clone(),
                status: r.status,
                word,
                fill,
                wait: (began, granted),
                run: (granted, ended),
            };
            start = start.min(began);
            end = end.max(ended);
            let models = r.hardware.as_ref().map(|h| &h.gpus);
            let mut place = |lane: Lane, model: Option<String>| match lanes
                .iter_mut()
                .find(|(l, ..)| *l == lane)
            {
                Some((_, _, rows)) => rows.push(row.clone()),
                None => lanes.push((lane, model, vec![row.clone()])),
            };
            if !r.gpus.is_empty() {
                for g in &r.gpus {
                    let model = models
                        .and_then(|m| m.iter().find(|h| h.uuid == g.uuid))
                        .and_then(|h| h.name.clone());
                    place(
                        Lane::Gpu {
                            node: g.node.clone(),
                            index: g.index,
                        },
                        model,
                    );
                }
            } else if r.gpu_count == 0 {
                place(Lane::Cpu, None);
            } else {
                place(Lane::NoGpu, None);
            }
        }
        if end == 0 {
            return None;
        }
        lanes.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Picture {
            run: results
                .first()
                .map(|b| b.record.run.clone())
                .unwrap_or_default(),
            lanes: lanes
                .into_iter()
                .map(|(lane, model, rows)| (lane.title(model.as_deref()), rows))
                .collect(),
            start,
            end,
            left_out,
        })
    }
}

/// Words a gantt line may start with: a batch so named is written `batch NAME`, so its
/// task is not read as a directive.
const GANTT_WORDS: [&str; 16] = [
    "title",
    "dateformat",
    "axisformat",
    "tickinterval",
    "excludes",
    "includes",
    "todaymarker",
    "weekday",
    "weekend",
    "section",
    "click",
    "acctitle",
    "accdescr",
    "inclusiveenddates",
    "topaxis",
    "displaymode",
];

/// A batch's name as a task name: as it is (batch names are `[A-Za-z0-9_.-]`, nothing
/// Mermaid reads as syntax), unless it is a gantt keyword.
fn task_name(batch: &str) -> String {
    if GANTT_WORDS.contains(&batch.to_ascii_lowercase().as_str()) {
        format!("batch {batch}")
    } else {
        batch.to_string()
    }
}

/// Text for a Mermaid title or section: one line, without `:`, `#` or `;` (which end
/// it or start a comment).
fn mermaid_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if matches!(c, ':' | '#' | ';' | '%') || c.is_control() {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// The Mermaid `gantt` block for `summary.md`: a section per GPU (per node and GPU under
/// Slurm; then CPU, then
/// batches never granted GPUs), a task for each batch's wait (when it waited) and one
/// for its run, `done` when it passed and `crit` otherwise. Times are Unix
/// milliseconds (`dateFormat x`); task names hold only a batch name (no `:`, `#`, `;`)
/// and a status word.
pub fn mermaid(results: &[BatchResult]) -> String {
    let Some(p) = Picture::of(results) else {
        return String::new();
    };
    // Mermaid leaves 75 px left of the bars for section names, and a GPU's name is
    // longer: without room, it is drawn over the bars.
    let longest = p
        .lanes
        .iter()
        .map(|(title, _)| title.chars().count())
        .max()
        .unwrap_or(0);
    let mut s = format!(
        "```mermaid\n%%{{init: {{\"gantt\": {{\"leftPadding\": {}}}}}}}%%\ngantt\n",
        (longest * 7 + 20).clamp(75, 400)
    );
    let _ = writeln!(
        s,
        "    title cibox run {} ({})",
        mermaid_text(&p.run),
        wall(&p)
    );
    let _ = writeln!(
        s,
        "    dateFormat x\n    axisFormat {}\n    todayMarker off",
        axis_format(p.end - p.start)
    );
    let mut id = 0;
    for (title, rows) in &p.lanes {
        let _ = writeln!(s, "    section {}", mermaid_text(title));
        for r in rows {
            let name = task_name(&r.batch);
            // Mermaid has three marks: a flaky pass is `active`, never `done`.
            let tag = match (r.status, r.fill == FLAKY) {
                (Status::Passed, true) => "active",
                (Status::Passed, false) => "done",
                _ => "crit",
            };
            if r.run.1 <= r.run.0 {
                // It never ran (its GPUs never came): its wait is all there is.
                id += 1;
                let _ = writeln!(
                    s,
                    "    {name} {} after waiting :{tag}, w{id}, {}, {}",
                    mermaid_text(&r.word),
                    r.wait.0,
                    r.wait.1
                );
                continue;
            }
            if r.wait.1 > r.wait.0 {
                id += 1;
                let _ = writeln!(
                    s,
                    "    {name} waits for GPUs :w{id}, {}, {}",
                    r.wait.0, r.wait.1
                );
            }
            id += 1;
            let _ = writeln!(
                s,
                "    {name} {} :{tag}, r{id}, {}, {}",
                mermaid_text(&r.word),
                r.run.0,
                r.run.1
            );
        }
    }
    s.push_str("```\n");
    if p.left_out > 0 {
        let _ = writeln!(s, "\n({} more batches not drawn)", p.left_out);
    }
    s
}

/// The run's wall time, from the first batch's start to the last one's end.
/// Ticks that tell apart the moments of a run `ms` long: milliseconds for a short one
/// (every tick of a second-long run would read the same second), no seconds for a long
/// one.
fn axis_format(ms: u64) -> &'static str {
    match ms {
        0..10_000 => "%M:%S.%L",
        10_000..7_200_000 => "%H:%M:%S",
        _ => "%H:%M",
    }
}

fn wall(p: &Picture) -> String {
    human(std::time::Duration::from_millis(p.end - p.start))
}

/// Text for SVG: `&`, `<`, `>`, `"` and `'` as entities, control characters dropped.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The fill of a run bar by how the batch ended.
fn colour(status: Status) -> &'static str {
    match status {
        Status::Passed => "#2da44e",
        Status::Failed => "#cf222e",
        Status::Timeout => "#bc4c00",
        Status::Cancelled => "#6e7781",
        Status::InfraError | Status::ImageRefused => "#8250df",
        Status::Capacity => "#9a6700",
        Status::NotRun => "#d0d7de",
    }
}

/// A step of the time axis that gives a handful of ticks over `span_ms`.
fn tick_step(span_ms: u64) -> u64 {
    const STEPS: [u64; 16] = [
        100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000, 900_000, 1_800_000, 3_600_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| span_ms / s <= 8)
        .unwrap_or_else(|| span_ms.div_ceil(8).div_ceil(3_600_000) * 3_600_000)
}

/// An offset from the run's start, for the axis: `+0s`, `+1.5s`, `+2m`, `+1h 30m`.
fn offset(ms: u64) -> String {
    if ms == 0 {
        "0".into()
    } else if ms < 10_000 && !ms.is_multiple_of(1000) {
        format!("+{:.1}s", ms as f64 / 1000.0)
    } else if ms < 60_000 {
        format!("+{}s", ms / 1000)
    } else if ms < 3_600_000 {
        let (m, s) = (ms / 60_000, ms % 60_000 / 1000);
        if s == 0 {
            format!("+{m}m")
        } else {
            format!("+{m}m {s:02}s")
        }
    } else {
        format!("+{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

/// Drawing sizes, in pixels.
const WIDTH: u64 = 1000;
const LABEL: u64 = 170;
const PLOT: u64 = WIDTH - LABEL - 30;
const ROW: u64 = 26;
const TOP: u64 = 64;

/// `timeline.svg`: the same picture, drawn by cibox (no script), with a time axis from
/// the run's start, a band per section, a row per batch with its wait (hatched grey)
/// and its run (coloured by how it ended, with its status and duration), a tooltip on
/// each bar and a legend.
pub fn svg(results: &[BatchResult]) -> Option<String> {
    let p = Picture::of(results)?;
    let span = (p.end - p.start).max(1);
    let x = |t: u64| LABEL + (t.saturating_sub(p.start)) * PLOT / span;
    let rows: u64 = p.lanes.iter().map(|(_, r)| 1 + r.len() as u64).sum();
    let height = TOP + rows * ROW + 70;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">
<defs><pattern id="wait" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#d0d7de"/><line x1="0" y1="0" x2="0" y2="6" stroke="#8c959f" stroke-width="2"/></pattern><pattern id="flaky" width="10" height="10" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="10" height="10" fill="#2da44e"/><line x1="0" y1="0" x2="0" y2="10" stroke="#bf8700" stroke-width="6"/></pattern></defs>
<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let started =
        crate::units::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_millis(p.start));
    let _ = writeln!(
        s,
        r##"<text x="12" y="24" font-size="16" font-weight="bold">cibox run {}</text>
<text x="12" y="44" fill="#57606a">{} batch(es){} from {} UTC, {} in all: which batch ran on which GPU, and how long it waited for it</text>"##,
        xml(&p.run),
        results.len(),
        match results
            .iter()
            .filter(|b| b.status() == Status::NotRun)
            .count()
        {
            0 => String::new(),
            n => format!(" ({n} not run)"),
        },
        &started[..19].replace('T', " "),
        wall(&p)
    );
    // The time axis: a line per tick across every row.
    let step = tick_step(span);
    let bottom = TOP + rows * ROW;
    let mut t = 0;
    while t <= span {
        let tx = x(p.start + t);
        let _ = writeln!(
            s,
            r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{bottom}" stroke="#eaeef2"/><text x="{tx}" y="{}" text-anchor="middle" fill="#57606a">{}</text>"##,
            TOP - 4,
            bottom + 16,
            offset(t)
        );
        t += step;
    }
    let mut y = TOP;
    for (title, lane_rows) in &p.lanes {
        let _ = writeln!(
            s,
            r##"<rect x="0" y="{y}" width="{WIDTH}" height="{ROW}" fill="#f6f8fa"/><text x="12" y="{}" font-weight="bold">{}</text>"##,
            y + 17,
            xml(title)
        );
        y += ROW;
        for r in lane_rows {
            s.push_str(&row_svg(r, y, &x));
            y += ROW;
        }
    }
    legend(&mut s, bottom + 34, p.left_out);
    s.push_str("</svg>\n");
    Some(s)
}

/// One batch's row: its name, its wait and its run.
fn row_svg(r: &Row, y: u64, x: &dyn Fn(u64) -> u64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<text x="24" y="{}">{}</text>"##,
        y + 17,
        xml(&r.batch)
    );
    let waited = r.wait.1 - r.wait.0;
    if waited > 0 {
        let (x0, x1) = (x(r.wait.0), x(r.wait.1));
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{}" width="{}" height="{}" fill="url(#wait)"><title>{} waited {} for its GPUs</title></rect>"##,
            y + 5,
            (x1 - x0).max(1),
            ROW - 10,
            xml(&r.batch),
            human(std::time::Duration::from_millis(waited))
        );
    }
    if r.run.1 <= r.run.0 {
        // It never ran (its GPUs never came): its wait, and how it ended after it.
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" fill="{}">{} after waiting</text>"##,
            x(r.wait.1) + 5,
            y + 17,
            r.fill,
            xml(&r.word)
        );
        return s;
    }
    let (x0, x1) = (x(r.run.0), x(r.run.1));
    let ran = human(std::time::Duration::from_millis(r.run.1 - r.run.0));
    let label = format!("{} {ran}", r.word);
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{}" width="{}" height="{}" rx="3" fill="{}"><title>{}: {label}</title></rect>"##,
        y + 4,
        (x1 - x0).max(2),
        ROW - 8,
        r.fill,
        xml(&r.batch)
    );
    // The status inside a bar wide enough for it, else after it.
    let inside = (x1 - x0) as usize > label.len() * 7 + 8;
    let (tx, fill) = if inside {
        (x0 + 5, "#ffffff")
    } else {
        (x1 + 5, "#24292f")
    };
    let _ = writeln!(
        s,
        r##"<text x="{tx}" y="{}" fill="{fill}">{}</text>"##,
        y + 17,
        xml(&label)
    );
    s
}

/// What the bars mean.
fn legend(s: &mut String, y: u64, left_out: usize) {
    let mut lx = 12;
    let _ = writeln!(
        s,
        r##"<rect x="{lx}" y="{}" width="18" height="12" fill="url(#wait)"/><text x="{}" y="{y}">waiting for GPUs</text>"##,
        y - 10,
        lx + 24
    );
    lx += 150;
    for (word, fill) in [
        ("passed", colour(Status::Passed)),
        ("flaky", FLAKY),
        ("failed", colour(Status::Failed)),
        ("timeout", colour(Status::Timeout)),
        ("infra_error", colour(Status::InfraError)),
        ("capacity", colour(Status::Capacity)),
        ("cancelled", colour(Status::Cancelled)),
    ] {
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{}" width="18" height="12" rx="3" fill="{fill}"/><text x="{}" y="{y}">{word}</text>"##,
            y - 10,
            lx + 24
        );
        lx += 40 + word.len() as u64 * 8;
    }
    if left_out > 0 {
        let _ = writeln!(
            s,
            r##"<text x="12" y="{}" fill="#57606a">{left_out} more batch(es) not drawn (at most {MAX_DRAWN})</text>"##,
            y + 20
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    /// The sample run spread out: `unit` on the CPU, `4a` waits 2.5 s for GPU 0, `8b`
    /// starts 3 s later on GPU 1, and one batch never gets its GPUs.
    fn spread_run() -> crate::report::outcome::RunResult {
        let mut run = sample::run();
        let b = &mut run.batches;
        b[0].record.gpus.clear();
        b[0].record.gpu_count = 0;
        b[1].record.gpu_wait_s = 2.5;
        b[2].record.started_at = "2026-11-30T03:00:03.000Z".into();
        b[2].record.gpus[0].index = 1;
        b[2].record.gpus[0].uuid = "GPU-00000000-0000-0000-0000-000000000001".into();
        let mut refused = b[1].clone();
        refused.record.batch = "8x".into();
        refused.record.status = Status::Capacity;
        refused.record.gpus.clear();
        refused.record.gpu_count = 8;
        refused.record.duration_s = 5.0;
        refused.record.gpu_wait_s = 5.0;
        b.push(refused);
        run
    }

    #[test]
    fn mermaid_of_a_mixed_run() {
        insta::assert_snapshot!(mermaid(&spread_run().batches));
    }

    #[test]
    fn svg_of_a_mixed_run() {
        insta::assert_snapshot!(svg(&spread_run().batches).unwrap());
    }

    /// Two batches run through Slurm at once, each on GPU 3 of its own node.
    fn two_nodes_run() -> crate::report::outcome::RunResult {
        let mut run = sample::run();
        run.batches.truncate(2);
        for (b, node) in run.batches.iter_mut().zip(["n1", "n2"]) {
            let r = &mut b.record;
            r.status = Status::Passed;
            r.gpus[0].index = 3;
            r.gpus[0].node = Some(node.into());
            r.gpu_wait_s = 1.5;
        }
        run
    }

    #[test]
    fn gpus_of_different_nodes_are_different_sections() {
        let run = two_nodes_run();
        let m = mermaid(&run.batches);
        insta::assert_snapshot!(m);
        assert!(
            m.contains("section n1 GPU 3 (NVIDIA H100 80GB HBM3)")
                && m.contains("section n2 GPU 3 (NVIDIA H100 80GB HBM3)"),
            "{m}"
        );
        let svg = svg(&run.batches).unwrap();
        for node in ["n1", "n2"] {
            assert!(
                svg.contains(&format!(
                    "font-weight=\"bold\">{node} GPU 3 (NVIDIA H100 80GB HBM3)</text>"
                )),
                "{svg}"
            );
        }
        assert!(!svg.contains(">GPU 3"), "{svg}");
    }

    #[test]
    fn names_mermaid_would_misread_are_made_plain() {
        assert_eq!(task_name("4a"), "4a");
        assert_eq!(task_name("Title"), "batch Title");
        assert_eq!(task_name("section"), "batch section");
        assert_eq!(mermaid_text("GPU 0 (A: #1; 50%)"), "GPU 0 (A   1  50 )");
    }

    #[test]
    fn ticks_and_offsets() {
        assert_eq!(tick_step(12_000), 2_000);
        assert_eq!(tick_step(600), 100);
        assert_eq!(tick_step(3 * 3_600_000), 1_800_000);
        assert_eq!(offset(1_500), "+1.5s");
        assert_eq!(offset(30_000), "+30s");
        assert_eq!(offset(90_000), "+1m 30s");
        assert_eq!(offset(5_400_000), "+1h 30m");
    }

    #[test]
    fn svg_is_one_well_formed_document_that_escapes_what_it_shows() {
        let mut run = sample::run();
        run.batches[0].record.batch = "a<b&\"c\"".into();
        let svg = svg(&run.batches).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("a&lt;b&amp;&quot;c&quot;"), "{svg}");
        assert!(!svg.contains("a<b"), "{svg}");
        // Nothing from elsewhere: no link, script or image.
        for needle in ["<script", "href", "<image", "@import"] {
            assert!(!svg.contains(needle), "{needle} in {svg}");
        }
        let mut reader = quick_xml::Reader::from_str(&svg);
        loop {
            match reader.read_event() {
                Ok(quick_xml::events::Event::Eof) => break,
                Ok(_) => {}
                Err(e) => panic!("not well-formed: {e}\n{svg}"),
            }
        }
    }
}
