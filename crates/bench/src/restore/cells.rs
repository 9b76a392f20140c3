//! Repeated restores of one cell (workload, disk, mode) summed up: the median of
//! each figure over the runs that succeeded, and the spread of the times, so that one
//! lucky or unlucky restore can neither make nor hide a result. A restore that failed
//! is counted, never measured: the cell says how many of its runs the medians are of.

use serde::Serialize;

use super::Record;

/// A part of the run that failed, with its error chain: one restore (a cell's round),
/// or what a cell's restores needed (the workload's snapshot, the emulated disk).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Failure {
    pub workload: String,
    /// `None`: the workload's snapshot failed, so none of its restores ran.
    pub disk: Option<String>,
    /// `None`: the disk could not be set up, so none of the workload's restores on
    /// it ran.
    pub mode: Option<String>,
    pub round: Option<usize>,
    pub error: String,
}

impl Failure {
    /// Whether this is one restore's failure (not a snapshot's or a disk's).
    pub fn is_restore(&self) -> bool {
        self.mode.is_some()
    }

    /// Where it happened: `kv/emulated/elastic round 2`, `kv/emulated` or `kv`.
    pub fn place(&self) -> String {
        match (&self.disk, &self.mode, self.round) {
            (Some(d), Some(m), Some(r)) => format!("{}/{d}/{m} round {}", self.workload, r + 1),
            (Some(d), _, _) => format!("{}/{d} (the emulated disk)", self.workload),
            _ => format!("{} (its snapshot)", self.workload),
        }
    }
}

/// How far a cell's runs spread.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Spread {
    /// Runs that succeeded: the medians are over these.
    pub runs: usize,
    /// Runs that failed (their errors are in the run's failures).
    pub failed: usize,
    pub running_min_s: Option<f64>,
    pub running_max_s: Option<f64>,
    pub responsive_min_s: Option<f64>,
    pub responsive_max_s: Option<f64>,
}

/// One cell: its figures, each the median over the runs that succeeded (`None` when
/// none did), and their spread.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Cell {
    #[serde(skip)]
    pub workload: String,
    #[serde(skip)]
    pub disk: String,
    #[serde(skip)]
    pub mode: String,
    #[serde(flatten)]
    pub median: Option<Record>,
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

/// The cells of the restores tried (each a record or a failure), in the order their
/// first run was made; failures of a snapshot or a disk belong to no cell.
pub(super) fn cells(tried: &[Result<Record, Failure>]) -> Vec<Cell> {
    let key = |t: &Result<Record, Failure>| match t {
        Ok(r) => Some((r.workload.clone(), r.disk.clone(), r.mode.clone())),
        Err(f) => match (&f.disk, &f.mode) {
            (Some(d), Some(m)) => Some((f.workload.clone(), d.clone(), m.clone())),
            _ => None,
        },
    };
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for k in tried.iter().filter_map(key) {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|k| {
            let of_cell: Vec<&Result<Record, Failure>> = tried
                .iter()
                .filter(|t| key(t).as_ref() == Some(&k))
                .collect();
            let runs: Vec<&Record> = of_cell.iter().filter_map(|t| t.as_ref().ok()).collect();
            let failed = of_cell.len() - runs.len();
            let (w, d, m) = k;
            let median = (!runs.is_empty()).then(|| median_of(&w, &d, &m, &runs));
            let (running_min_s, running_max_s) = min_max(runs.iter().map(|r| r.time_to_running_s));
            let (responsive_min_s, responsive_max_s) =
                min_max(runs.iter().map(|r| r.time_to_responsive_s));
            Cell {
                workload: w,
                disk: d,
                mode: m,
                median,
                spread: Spread {
                    runs: runs.len(),
                    failed,
                    running_min_s,
                    running_max_s,
                    responsive_min_s,
                    responsive_max_s,
                },
            }
        })
        .collect()
}

/// Each figure of one cell: the median over its runs (at least one).
fn median_of(w: &str, d: &str, m: &str, runs: &[&Record]) -> Record {
    let f = |g: fn(&Record) -> Option<f64>| median_f(runs.iter().map(|r| g(r)));
    let u = |g: fn(&Record) -> Option<u64>| median_u(runs.iter().map(|r| g(r)));
    let z = |g: fn(&Record) -> u64| median_u(runs.iter().map(|r| Some(g(r)))).unwrap_or(0);
    let mut notes: Vec<String> = Vec::new();
    for n in runs.iter().flat_map(|r| &r.notes) {
        if !notes.contains(n) {
            notes.push(n.clone());
        }
    }
    Record {
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
        page_requests_after_start: u(|r| r.page_requests_after_start),
        request_service_p50_us: f(|r| r.request_service_p50_us),
        request_service_p99_us: f(|r| r.request_service_p99_us),
        memory_loaded_s: f(|r| r.memory_loaded_s),
        exact_trace_pages: u(|r| r.exact_trace_pages),
        pagemap_trace_pages: u(|r| r.pagemap_trace_pages),
        exact_in_pagemap: f(|r| r.exact_in_pagemap),
        notes,
    }
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
        let c = cells(&r.into_iter().map(Ok).collect::<Vec<_>>());
        assert_eq!(c.len(), 2);
        let m = c[0].median.as_ref().expect("a measured cell");
        assert_eq!(m.mode, "elastic");
        assert_eq!(m.time_to_running_s, Some(0.6));
        // A run that never answered is left out of the median, not counted as zero.
        assert_eq!(m.time_to_responsive_s, Some(1.3));
        assert_eq!(m.major_faults_after_start, Some(20));
        assert_eq!(m.notes, ["fell back"]);
        assert_eq!(
            c[0].spread,
            Spread {
                runs: 3,
                failed: 0,
                running_min_s: Some(0.5),
                running_max_s: Some(0.9),
                responsive_min_s: Some(1.1),
                responsive_max_s: Some(1.5),
            }
        );
        assert_eq!(c[1].spread.runs, 1);
        assert_eq!(
            c[1].median.as_ref().and_then(|m| m.time_to_running_s),
            Some(0.2)
        );
    }

    fn failed(w: &str, d: Option<&str>, m: Option<&str>, round: Option<usize>) -> Failure {
        Failure {
            workload: w.into(),
            disk: d.map(Into::into),
            mode: m.map(Into::into),
            round,
            error: "kvbr1-kv-elastic-real-1: the restore failed: QEMU exited".into(),
        }
    }

    #[test]
    fn a_failed_round_is_counted_and_left_out_of_the_medians() {
        let tried = vec![
            Ok(rec("kv", "real", "elastic", 0.5, 1.5, 10)),
            Ok(rec("kv", "real", "lazy", 0.2, 6.0, 1000)),
            Err(failed("kv", Some("real"), Some("elastic"), Some(1))),
            Err(failed("kv", Some("real"), Some("stock"), Some(1))),
            Ok(rec("kv", "real", "elastic", 0.9, 2.5, 30)),
            // The emulated disk could not be set up, and memfill's snapshot failed:
            // no cell of theirs was tried.
            Err(failed("kv", Some("emulated"), None, None)),
            Err(failed("memfill", None, None, None)),
        ];
        let c = cells(&tried);
        let names: Vec<String> = c
            .iter()
            .map(|c| format!("{}/{}/{}", c.workload, c.disk, c.mode))
            .collect();
        assert_eq!(names, ["kv/real/elastic", "kv/real/lazy", "kv/real/stock"]);
        // Two of three rounds measured: the medians are theirs alone.
        let m = c[0].median.as_ref().expect("two rounds succeeded");
        assert_eq!(m.time_to_running_s, Some(0.7));
        assert_eq!(m.time_to_responsive_s, Some(2.0));
        assert_eq!(m.major_faults_after_start, Some(20));
        assert_eq!((c[0].spread.runs, c[0].spread.failed), (2, 1));
        assert_eq!(c[0].spread.running_max_s, Some(0.9));
        assert_eq!((c[1].spread.runs, c[1].spread.failed), (1, 0));
        // Every round failed: a cell with no figures, not one of zeros.
        assert!(c[2].median.is_none());
        assert_eq!((c[2].spread.runs, c[2].spread.failed), (0, 1));
        assert_eq!(c[2].spread.running_min_s, None);
        let places: Vec<String> = tried
            .iter()
            .filter_map(|t| t.as_ref().err().map(Failure::place))
            .collect();
        assert_eq!(
            places,
            [
                "kv/real/elastic round 2",
                "kv/real/stock round 2",
                "kv/emulated (the emulated disk)",
                "memfill (its snapshot)"
            ]
        );
    }
}
