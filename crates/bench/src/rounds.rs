//! What every benchmark that repeats its cases in rounds shares: a figure's median
//! with its min and max over the runs that measured it, and the runs that failed.
//! A failed run is recorded (which case, which round, its error in one line) and
//! left out of every median; the benchmark goes on with the others and exits
//! non-zero at the end ([`Incomplete`]), so no median silently includes a failure.

use serde::Serialize;

/// One figure over the runs that measured it: its median (the mean of the two
/// middle values for an even count), min and max, and how many runs it is of.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    /// The finite values only (a run that did not measure the figure gives NaN);
    /// `None` when there is none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stat> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// `median [min–max]` with `prec` decimals; the range is left out of one run.
    pub fn show(&self, prec: usize) -> String {
        if self.n == 1 {
            format!("{:.prec$}", self.median)
        } else {
            format!(
                "{:.prec$} [{:.prec$}–{:.prec$}]",
                self.median, self.min, self.max
            )
        }
    }
}

/// [`Stat::show`] of a figure no run measured: `-`.
pub fn show(s: &Option<Stat>, prec: usize) -> String {
    s.map_or_else(|| "-".into(), |s| s.show(prec))
}

/// One run that failed: its case, its round (from 1) and its error chain in one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub case: String,
    pub round: usize,
    pub error: String,
}

impl Failure {
    /// `round` counts from 0, as the benchmarks' loops do.
    pub fn new(case: impl Into<String>, round: usize, e: &dyn std::error::Error) -> Failure {
        let error = rebound_errors::chain(e)
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        Failure {
            case: case.into(),
            round: round + 1,
            error,
        }
    }

    /// The line the text report prints.
    pub fn line(&self) -> String {
        format!("FAILED {} round {}: {}", self.case, self.round, self.error)
    }
}

/// Some runs failed: the run's exit, after its figures over the others were printed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{failed} of {tried} runs failed (each listed with its error above); the medians are over the others")]
pub struct Incomplete {
    pub failed: usize,
    pub tried: usize,
}

impl Incomplete {
    /// `Err` when any of the `tried` runs failed.
    pub fn check(failures: &[Failure], tried: usize) -> Result<(), Incomplete> {
        if failures.is_empty() {
            return Ok(());
        }
        Err(Incomplete {
            failed: failures.len(),
            tried: tried.max(failures.len()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_the_median_of_the_runs_that_measured_it() {
        let s = Stat::of([3.0, f64::NAN, 1.0, 2.0]).expect("three measured");
        assert_eq!(
            s,
            Stat {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                n: 3
            }
        );
        assert_eq!(s.show(1), "2.0 [1.0–3.0]");
        assert_eq!(Stat::of([4.0, 1.0]).map(|s| s.median), Some(2.5));
        assert_eq!(Stat::of([f64::NAN]), None);
        assert_eq!(show(&None, 3), "-");
        assert_eq!(show(&Stat::of([0.25]), 2), "0.25");
    }

    #[test]
    fn a_failure_is_one_line_and_the_run_exits_non_zero() {
        let e = std::io::Error::other("the guest did not boot\nwithin 120 s");
        let f = Failure::new("ring/line", 1, &e);
        assert_eq!(
            f.line(),
            "FAILED ring/line round 2: the guest did not boot within 120 s"
        );
        assert_eq!(Incomplete::check(&[], 6), Ok(()));
        let err = Incomplete::check(&[f], 6).expect_err("one run failed");
        assert_eq!(err.to_string(), "1 of 6 runs failed (each listed with its error above); the medians are over the others");
    }
}
