//! The cluster benchmark's SVG: HotRestore's figure 7 per topology, each VM's median
//! restore latency (grey, one shade per variant) and median backoff (red) over the
//! rounds that measured them, with a whisker from the least to the most disruption.

use super::TopologyResult;
use crate::clusters::Clusters;
use crate::rounds::Stat;

/// One VM's bar of one variant: medians over the rounds.
struct Bar {
    latency: Stat,
    backoff: Option<Stat>,
    disruption: Option<Stat>,
}

/// A topology's panel: its name, its VMs, per VM and variant a bar.
type Panel<'a> = (&'a String, Vec<String>, Vec<Vec<Option<Bar>>>);

/// Per VM (in the spec's order) and variant, its bar; `None` when no round measured it.
fn bars<P: Clusters>(
    results: &[&TopologyResult<P::Variant, P::Outcome>],
    variants: &[P::Variant],
) -> (Vec<String>, Vec<Vec<Option<Bar>>>) {
    let vms: Vec<String> = results
        .iter()
        .flat_map(|r| r.runs.first())
        .next()
        .map(|x| x.vms.iter().map(|v| v.vm.clone()).collect())
        .unwrap_or_default();
    let bars = vms
        .iter()
        .map(|vm| {
            variants
                .iter()
                .map(|v| {
                    let rows: Vec<&super::VmRow> = results
                        .iter()
                        .flat_map(|r| r.runs.iter().filter(|x| x.variant == *v))
                        .flat_map(|x| x.vms.iter().filter(|r| &r.vm == vm))
                        .collect();
                    Some(Bar {
                        latency: Stat::of(rows.iter().map(|r| r.restore_latency_s))?,
                        backoff: Stat::of(rows.iter().map(|r| r.backoff_s.max(0.0))),
                        disruption: Stat::of(rows.iter().map(|r| r.disruption_s)),
                    })
                })
                .collect()
        })
        .collect();
    (vms, bars)
}

/// Figure 7 of the paper, per topology: each VM's median restore latency (grey) and
/// median backoff (red), one bar per variant, a whisker over the disruption's range.
pub(super) fn draw<P: Clusters>(
    topologies: &[String],
    results: &[TopologyResult<P::Variant, P::Outcome>],
    variants: &[P::Variant],
    rounds: usize,
) -> String {
    let panels: Vec<Panel> = topologies
        .iter()
        .map(|t| {
            let of: Vec<&TopologyResult<P::Variant, P::Outcome>> =
                results.iter().filter(|r| &r.topology == t).collect();
            let (vms, b) = bars::<P>(&of, variants);
            (t, vms, b)
        })
        .collect();
    let rows: usize = panels.iter().map(|p| p.1.len()).max().unwrap_or(0);
    let bar = 9.0;
    let group = bar * variants.len() as f64 + 6.0;
    let panel_h = group * rows as f64 + 40.0;
    let (left, panel_w) = (60.0, 330.0);
    let w = (left + panel_w * panels.len() as f64 + 20.0)
        .max(left + 170.0 * (variants.len() + 1) as f64);
    let h = panel_h + 76.0;
    let max = panels
        .iter()
        .flat_map(|p| p.2.iter().flatten().flatten())
        .flat_map(|b| [Some(b.latency.max), b.disruption.map(|d| d.max)])
        .flatten()
        .fold(0.1, f64::max);
    // Grey for the page cache's variants, blue for the page server's (`ps-`).
    let color = |v: P::Variant, j: usize| {
        let (greys, blues) = (
            ["#444", "#888", "#bbb", "#ddd"],
            ["#08519c", "#3182bd", "#6baed6", "#c6dbef"],
        );
        let set = if P::variant_name(v).starts_with("ps-") {
            blues
        } else {
            greys
        };
        set[j % set.len()]
    };
    // The shade of a variant within its path.
    let shade: Vec<&str> = variants
        .iter()
        .enumerate()
        .map(|(j, v)| {
            let ps = P::variant_name(*v).starts_with("ps-");
            let k = variants[..j]
                .iter()
                .filter(|u| P::variant_name(**u).starts_with("ps-") == ps)
                .count();
            color(*v, k)
        })
        .collect();
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
"##
    );
    for (p, (topology, vms, bars)) in panels.iter().enumerate() {
        let x0 = left + panel_w * p as f64;
        let scale = (panel_w - 40.0) / max;
        s += &format!("<text x=\"{x0:.0}\" y=\"16\" font-weight=\"bold\">{topology}</text>\n");
        for (i, vm) in vms.iter().enumerate() {
            let y = 30.0 + group * i as f64;
            if p == 0 {
                s += &format!("<text x=\"8\" y=\"{:.0}\">{vm}</text>\n", y + group / 2.0);
            }
            for (j, b) in bars[i].iter().enumerate() {
                let Some(b) = b else { continue };
                let yb = y + bar * j as f64;
                let lw = b.latency.median * scale;
                let name = P::variant_name(variants[j]);
                s += &format!(
                    "<rect x=\"{x0:.1}\" y=\"{yb:.1}\" width=\"{lw:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{vm} {name}: restore {} s over {} round(s)</title></rect>\n",
                    bar - 1.0,
                    shade[j],
                    b.latency.show(3),
                    b.latency.n
                );
                if let Some(bo) = b.backoff.filter(|bo| bo.median > 0.0) {
                    s += &format!(
                        "<rect x=\"{:.1}\" y=\"{yb:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#d62728\"><title>backoff {} s</title></rect>\n",
                        x0 + lw,
                        bo.median * scale,
                        bar - 1.0,
                        bo.show(3)
                    );
                }
                if let Some(d) = b.disruption.filter(|d| d.n > 1) {
                    let ym = yb + (bar - 1.0) / 2.0;
                    s += &format!(
                        "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{ym:.1}\" y2=\"{ym:.1}\" stroke=\"black\"><title>disruption {} s</title></line>\n",
                        x0 + d.min * scale,
                        x0 + d.max * scale,
                        d.show(3)
                    );
                }
            }
        }
        let yb = 30.0 + group * rows as f64 + 12.0;
        s += &format!(
            "<line x1=\"{x0:.0}\" y1=\"{:.0}\" x2=\"{:.0}\" y2=\"{:.0}\" stroke=\"black\"/>\n<text x=\"{x0:.0}\" y=\"{:.0}\">0</text><text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{max:.2} s</text>\n",
            yb - 8.0,
            x0 + panel_w - 40.0,
            yb - 8.0,
            yb + 4.0,
            x0 + panel_w - 40.0,
            yb + 4.0
        );
    }
    let ly = panel_h + 35.0;
    for (j, v) in variants.iter().enumerate() {
        let lx = left + 170.0 * j as f64;
        s += &format!(
            "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"12\" height=\"9\" fill=\"{}\"/><text x=\"{:.0}\" y=\"{ly:.0}\">{} restore latency</text>\n",
            ly - 8.0,
            shade[j],
            lx + 16.0,
            P::variant_name(*v)
        );
    }
    let lx = left + 170.0 * variants.len() as f64;
    s += &format!(
        "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"12\" height=\"9\" fill=\"#d62728\"/><text x=\"{:.0}\" y=\"{ly:.0}\">backoff</text>\n",
        ly - 8.0,
        lx + 16.0
    );
    s += &format!(
        "<text x=\"{left:.0}\" y=\"{:.0}\" fill=\"#555\">medians over {rounds} round(s) (a VM no round measured has no bar); whisker: min to max disruption</text>\n</svg>\n",
        ly + 18.0
    );
    s
}
