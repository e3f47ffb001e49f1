//! The timeline as an SVG picture: one lane per replica (terms as leader,
//! faults, side effects) and one for the lock service (leases, failovers,
//! restarts).

use std::fmt::Write as _;

use crate::report::{Timeline, xml_escape};
use crate::resource::Verdict;

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 110.0;
const LANE: f64 = 46.0;
const TOP: f64 = 40.0;

/// Renders `timeline` with `title` above it.
pub fn render(timeline: &Timeline, title: &str) -> String {
    let end = timeline.end.max(1) as f64;
    let x = |t: u64| LEFT + (t as f64 / end) * (WIDTH - LEFT - 20.0);
    let lanes = timeline.replicas + 1;
    let height = TOP + LANE * lanes as f64 + 70.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    s.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(s, r#"<text x="10" y="20" font-size="13">"#);
    xml_escape(&mut s, title);
    s.push_str("</text>");
    let lane_y = |lane: usize| TOP + LANE * lane as f64;
    for r in 0..timeline.replicas {
        let y = lane_y(r);
        let clock = timeline
            .clocks
            .get(r)
            .copied()
            .unwrap_or(crate::clock::Clock::EXACT);
        let _ = write!(
            s,
            r##"<text x="10" y="{:.1}">replica {r}</text><text x="10" y="{:.1}" fill="#666">{:+} ms {:+} ppm</text><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            y + 16.0,
            y + 29.0,
            clock.offset_ns / 1_000_000,
            clock.drift_ppm,
            WIDTH - 20.0,
            y + 20.0,
            y + 20.0
        );
    }
    let service = lane_y(timeline.replicas);
    let _ = write!(
        s,
        r#"<text x="10" y="{:.1}">lock service</text>"#,
        service + 16.0
    );

    for f in &timeline.faults {
        let (color, lane) = match f.kind {
            "crash" => ("#e57373", f.replica),
            "pause" => ("#ffb74d", f.replica),
            "partition" => ("#90a4ae", f.replica),
            "restart" => ("#4dd0e1", timeline.replicas),
            _ => ("#ba68c8", timeline.replicas),
        };
        let y = lane_y(lane.min(timeline.replicas));
        let w = (x(f.to) - x(f.from)).max(2.0);
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="36" fill="{color}" opacity="0.35"><title>{} {:.3}s–{:.3}s</title></rect>"#,
            x(f.from),
            y + 2.0,
            f.kind,
            f.from as f64 / 1e9,
            f.to as f64 / 1e9
        );
    }
    for t in &timeline.terms {
        let y = lane_y(t.replica);
        let w = (x(t.to) - x(t.from)).max(1.0);
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="12" fill="#43a047"><title>leader, fence {} {:.3}s–{:.3}s</title></rect>"##,
            x(t.from),
            y + 14.0,
            t.fence,
            t.from as f64 / 1e9,
            t.to as f64 / 1e9
        );
    }
    for g in &timeline.grants {
        let _ = write!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#1e88e5" stroke-width="3"><title>lease fence {} to replica {} until {:.3}s (unless renewed)</title></line><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#1e88e5"/>"##,
            x(g.from),
            x(g.to),
            service + 20.0,
            service + 20.0,
            g.fence,
            g.replica,
            g.to as f64 / 1e9,
            x(g.from),
            x(g.from),
            service + 12.0,
            service + 28.0
        );
    }
    for e in &timeline.effects {
        let color = match e.verdict {
            Verdict::Accepted => "#2e7d32",
            Verdict::AcceptedStale => "#d32f2f",
            Verdict::RejectedStale => "#000000",
        };
        let y = lane_y(e.replica) + 34.0;
        let _ = write!(
            s,
            r#"<circle cx="{:.1}" cy="{y:.1}" r="2" fill="{color}"><title>effect fence {} {:?}</title></circle>"#,
            x(e.at),
            e.fence,
            e.verdict
        );
    }
    let legend_y = service + LANE + 10.0;
    let _ = write!(
        s,
        r##"<text x="10" y="{legend_y:.1}"><tspan fill="#43a047">■ leader</tspan>  <tspan fill="#1e88e5">━ lease</tspan>  <tspan fill="#2e7d32">● effect accepted</tspan>  <tspan fill="#000">● stale, rejected</tspan>  <tspan fill="#d32f2f">● stale, accepted</tspan>  <tspan fill="#e57373">■ crash</tspan>  <tspan fill="#ffb74d">■ pause</tspan>  <tspan fill="#90a4ae">■ partition</tspan>  <tspan fill="#ba68c8">■ failover</tspan>  <tspan fill="#4dd0e1">■ restart</tspan></text><text x="10" y="{:.1}" fill="#666">0 s … {:.1} s of simulated time</text>"##,
        legend_y + 18.0,
        timeline.end as f64 / 1e9
    );
    s.push_str("</svg>\n");
    s
}
