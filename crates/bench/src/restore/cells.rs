//! Repeated restores of one cell (workload, disk, mode) summed up: the median of
//! each figure over the runs, and the spread of the times, so that one lucky or
//! unlucky restore can neither make nor hide a result.

use serde::Serialize;

use super::Record;

/// How far a cell's runs spread.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Spread {
    pub runs: usize,
    pub running_min_s: Option<f64>,
    pub running_max_s: Option<f64>,
    pub responsive_min_s: Option<f64>,
    pub responsive_max_s: Option<f64>,
}

/// One cell: its figures, each the median over the runs, and their spread.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Cell {
    #[serde(flatten)]
    pub median: Record,
    pub spread: Spread,
}

/// The median of what is there (runs that did not measure a figure are left out);
/// the mean of the two middle values for an even count.
fn median_f(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut v: Vec<f64> = v.flatten().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn median_u(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    median_f(v.map(|x| x.map(|x| x as f64))).map(|m| m.round() as u64)
}

fn min_max(v: impl Iterator<Item = Option<f64>>) -> (Option<f64>, Option<f64>) {
    let v: Vec<f64> = v.flatten().collect();
    (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    )
}

/// The cells of `records`, in the order their first run was made.
pub(super) fn cells(records: &[Record]) -> Vec<Cell> {
    let mut keys: Vec<(&str, &str, &str)> = Vec::new();
    for r in records {
        let k = (r.workload.as_str(), r.disk.as_str(), r.mode.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(w, d, m)| {
            let runs: Vec<&Record> = records
                .iter()
                .filter(|r| r.workload == w && r.disk == d && r.mode == m)
                .collect();
            let f = |g: fn(&Record) -> Option<f64>| median_f(runs.iter().map(|r| g(r)));
            let u = |g: fn(&Record) -> Option<u64>| median_u(runs.iter().map(|r| g(r)));
            let z = |g: fn(&Record) -> u64| median_u(runs.iter().map(|r| Some(g(r)))).unwrap_or(0);
            let mut notes: Vec<String> = Vec::new();
            for n in runs.iter().flat_map(|r| &r.notes) {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
            let (running_min_s, running_max_s) = min_max(runs.iter().map(|r| r.time_to_running_s));
            let (responsive_min_s, responsive_max_s) =
                min_max(runs.iter().map(|r| r.time_to_responsive_s));
            Cell {
                median: Record {
                    workload: w.into(),
                    disk: d.into(),
                    mode: m.into(),
                    round: 0,
                    time_to_running_s: f(|r| r.time_to_running_s),
                    time_to_responsive_s: f(|r| r.time_to_responsive_s),
                    responsive_after_start_s: f(|r| r.responsive_after_start_s),
                    pages_loaded_before_start: z(|r| r.pages_loaded_before_start),
                    bytes_loaded_before_start: z(|r| r.bytes_loaded_before_start),
                    load_before_start_s: f(|r| Some(r.load_before_start_s)).unwrap_or(0.0),
                    major_faults_after_start: u(|r| r.major_faults_after_start),
                    bytes_read_after_start: u(|r| r.bytes_read_after_start),
                    working_set_pages: z(|r| r.working_set_pages),
                    hit_rate: f(|r| r.hit_rate),
                    accuracy: f(|r| r.accuracy),
                    pages_touched_after_start: z(|r| r.pages_touched_after_start),
                    background_pages: z(|r| r.background_pages),
                    background_s: f(|r| r.background_s),
                    client_answers: u(|r| r.client_answers),
                    notes,
                },
                spread: Spread {
                    runs: runs.len(),
                    running_min_s,
                    running_max_s,
                    responsive_min_s,
                    responsive_max_s,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::rec;
    use super::*;

    #[test]
    fn a_cell_is_the_median_of_its_runs_with_their_spread() {
        let mut r = vec![
            rec("kv", "real", "elastic", 0.5, 1.5, 10),
            rec("kv", "real", "lazy", 0.2, 6.0, 1000),
            rec("kv", "real", "elastic", 0.9, 1.1, 30),
            rec("kv", "real", "elastic", 0.6, 9.0, 20),
        ];
        r[3].notes = vec!["fell back".into()];
        r[3].time_to_responsive_s = None;
        let c = cells(&r);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].median.mode, "elastic");
        assert_eq!(c[0].median.time_to_running_s, Some(0.6));
        // A run that never answered is left out of the median, not counted as zero.
        assert_eq!(c[0].median.time_to_responsive_s, Some(1.3));
        assert_eq!(c[0].median.major_faults_after_start, Some(20));
        assert_eq!(c[0].median.notes, ["fell back"]);
        assert_eq!(
            c[0].spread,
            Spread {
                runs: 3,
                running_min_s: Some(0.5),
                running_max_s: Some(0.9),
                responsive_min_s: Some(1.1),
                responsive_max_s: Some(1.5),
            }
        );
        assert_eq!(c[1].spread.runs, 1);
        assert_eq!(c[1].median.time_to_running_s, Some(0.2));
    }
}
