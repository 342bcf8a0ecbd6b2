//! `--shard auto`: the shard from a batch system's environment, so that an array job needs no
//! arithmetic in its script.
//!
//! * **Slurm job arrays** (`sbatch --array=MIN-MAX[:STEP]`, Slurm's "Job Array Support" page):
//!   `SLURM_ARRAY_TASK_ID`, `SLURM_ARRAY_TASK_MIN`, `SLURM_ARRAY_TASK_STEP` (1 when unset),
//!   `SLURM_ARRAY_TASK_COUNT` and/or `SLURM_ARRAY_TASK_MAX`. Shard I of N with
//!   I = (ID - MIN) / STEP and N = COUNT (or (MAX - MIN) / STEP + 1), so `--array=1-16` and
//!   `--array=0-15` both make 16 shards 0..15, and `--array=0-30:2` makes 16 too. An array that
//!   is not such a range (a list like `--array=1,3,7`) is refused: give `--shard I/N`.
//! * **Kubernetes Indexed Jobs** (`completionMode: Indexed`): `JOB_COMPLETION_INDEX` (0-based)
//!   is I; Kubernetes does not export the completion count, so N comes from `--shard auto/N` or
//!   `TPUSIM_SHARD_COUNT`.
//!
//! `--shard auto/N` also checks a Slurm array's count against N. Finding both systems'
//! variables, or neither, is an error naming what was found.

use crate::exec::Shard;
use crate::SweepError;

/// The variable that gives the shard count when the batch system does not (Kubernetes).
pub const SHARD_COUNT_VAR: &str = "TPUSIM_SHARD_COUNT";

/// The Slurm array variables `--shard auto` reads.
pub const SLURM_VARS: [&str; 5] =
    ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MAX"];

/// The Kubernetes Indexed Job variable `--shard auto` reads.
pub const K8S_INDEX_VAR: &str = "JOB_COMPLETION_INDEX";

/// A shard and where it came from (for the run's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardChoice {
    /// The shard to run.
    pub shard: Shard,
    /// How it was found: `None` for an explicit `I/N`, else the variables read, e.g.
    /// `SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_MIN=1, SLURM_ARRAY_TASK_STEP=1, SLURM_ARRAY_TASK_COUNT=16`.
    pub from: Option<String>,
}

impl Shard {
    /// Parses a `--shard` value: `I/N`, `auto` or `auto/N` (module docs), reading the
    /// environment through `env` (`|k| std::env::var(k).ok()` for the process's own).
    ///
    /// # Errors
    /// [`SweepError::Input`] naming the flag, the variables and their values.
    pub fn choose(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<ShardChoice, SweepError> {
        let v = value.trim();
        let Some(rest) = v.strip_prefix("auto") else {
            return Ok(ShardChoice { shard: Shard::parse(v)?, from: None });
        };
        let count = match rest.strip_prefix('/') {
            _ if rest.is_empty() => None,
            Some(n) => Some(
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| SweepError::new(format!("--shard {value}: expected auto, auto/N with N >= 1, or I/N")))?,
            ),
            None => return Err(SweepError::new(format!("--shard {value}: expected auto, auto/N with N >= 1, or I/N"))),
        };
        Shard::from_env(count, env).map_err(|e| SweepError::new(format!("--shard {value}: {e}")))
    }

    /// The shard of this task of a Slurm array or Kubernetes Indexed Job (module docs); `count`
    /// is the N of `--shard auto/N`.
    ///
    /// # Errors
    /// A message naming the variables: none found, both systems found, values that are not
    /// whole numbers, an array that is not a regular range, or counts that disagree.
    pub fn from_env(count: Option<u64>, env: &dyn Fn(&str) -> Option<String>) -> Result<ShardChoice, String> {
        let get = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let num = |k: &str| -> Result<Option<u64>, String> {
            match get(k) {
                None => Ok(None),
                Some(v) => v.parse::<u64>().map(Some).map_err(|_| format!("{k}={v} is not a whole number")),
            }
        };
        let slurm = get(SLURM_VARS[0]).is_some();
        let k8s = get(K8S_INDEX_VAR).is_some();
        let shown = |keys: &[&str]| keys.iter().filter_map(|k| get(k).map(|v| format!("{k}={v}"))).collect::<Vec<_>>().join(", ");
        let env_count = num(SHARD_COUNT_VAR)?;
        if let (Some(a), Some(b)) = (count, env_count) {
            if a != b {
                return Err(format!("auto/{a} disagrees with {SHARD_COUNT_VAR}={b}"));
            }
        }
        let shard = match (slurm, k8s) {
            (true, true) => {
                return Err(format!(
                    "both a Slurm array ({}) and a Kubernetes Indexed Job ({K8S_INDEX_VAR}={}) are set; give --shard I/N",
                    shown(&SLURM_VARS),
                    get(K8S_INDEX_VAR).unwrap_or_default()
                ))
            }
            (false, false) => {
                return Err(format!(
                    "no batch-system shard found: neither {} (a Slurm job array) nor {K8S_INDEX_VAR} (a Kubernetes Indexed Job) is set; give --shard I/N",
                    SLURM_VARS[0]
                ))
            }
            (true, false) => {
                let id = num(SLURM_VARS[0])?.unwrap_or(0);
                let min = num(SLURM_VARS[1])?.ok_or_else(|| format!("{} is set but {} is not", SLURM_VARS[0], SLURM_VARS[1]))?;
                let step = num(SLURM_VARS[2])?.unwrap_or(1);
                if step == 0 {
                    return Err(format!("{}=0: a Slurm array step is at least 1", SLURM_VARS[2]));
                }
                let (n_count, max) = (num(SLURM_VARS[3])?, num(SLURM_VARS[4])?);
                let irregular = || {
                    format!(
                        "the Slurm array is not a range MIN-MAX:STEP ({}): give --shard I/N with I counted from 0",
                        shown(&SLURM_VARS)
                    )
                };
                if id < min || (id - min) % step != 0 {
                    return Err(irregular());
                }
                let from_max = match max {
                    Some(m) if m < min || (m - min) % step != 0 => return Err(irregular()),
                    Some(m) => Some((m - min) / step + 1),
                    None => None,
                };
                let n = match (n_count, from_max) {
                    (Some(c), Some(f)) if c != f => return Err(irregular()),
                    (Some(c), _) => c,
                    (None, Some(f)) => f,
                    (None, None) => {
                        return Err(format!("{} is set but neither {} nor {} is", SLURM_VARS[0], SLURM_VARS[3], SLURM_VARS[4]))
                    }
                };
                if let Some(c) = count.or(env_count) {
                    if c != n {
                        return Err(format!("the Slurm array has {n} tasks ({}), not {c}", shown(&SLURM_VARS)));
                    }
                }
                let index = (id - min) / step;
                if index >= n {
                    return Err(irregular());
                }
                ShardChoice { shard: Shard { index, count: n }, from: Some(shown(&SLURM_VARS)) }
            }
            (false, true) => {
                let index = num(K8S_INDEX_VAR)?.unwrap_or(0);
                let n = count.or(env_count).ok_or_else(|| {
                    format!(
                        "{K8S_INDEX_VAR}={index} (a Kubernetes Indexed Job) gives the index but not the count: give --shard auto/N (N = the Job's completions) or set {SHARD_COUNT_VAR}"
                    )
                })?;
                if index >= n {
                    return Err(format!("{K8S_INDEX_VAR}={index} is not below the shard count {n}"));
                }
                let mut from = format!("{K8S_INDEX_VAR}={index}");
                if count.is_none() {
                    from.push_str(&format!(", {SHARD_COUNT_VAR}={n}"));
                }
                ShardChoice { shard: Shard { index, count: n }, from: Some(from) }
            }
        };
        Ok(shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k: &str| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    fn slurm(id: u64, min: u64, max: u64, step: u64, count: u64) -> Vec<(String, String)> {
        [("ID", id), ("MIN", min), ("MAX", max), ("STEP", step), ("COUNT", count)]
            .iter()
            .map(|(k, v)| (format!("SLURM_ARRAY_TASK_{k}"), v.to_string()))
            .collect()
    }

    fn choose(value: &str, pairs: &[(String, String)]) -> Result<Shard, String> {
        let p: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Shard::choose(value, &env_of(&p)).map(|c| c.shard).map_err(|e| e.to_string())
    }

    #[test]
    fn slurm_arrays_one_based_zero_based_and_stepped_all_make_shards_from_zero() {
        // --array=1-16: task 16 is the last shard, task 1 the first.
        assert_eq!(choose("auto", &slurm(1, 1, 16, 1, 16)).unwrap(), Shard { index: 0, count: 16 });
        assert_eq!(choose("auto", &slurm(16, 1, 16, 1, 16)).unwrap(), Shard { index: 15, count: 16 });
        // --array=0-15.
        assert_eq!(choose("auto", &slurm(0, 0, 15, 1, 16)).unwrap(), Shard { index: 0, count: 16 });
        // --array=0-30:2 and --array=5-20:5.
        assert_eq!(choose("auto", &slurm(30, 0, 30, 2, 16)).unwrap(), Shard { index: 15, count: 16 });
        assert_eq!(choose("auto/4", &slurm(15, 5, 20, 5, 4)).unwrap(), Shard { index: 2, count: 4 });
        // Every task of --array=3-9 gets a distinct shard, together all of them.
        let got: Vec<u64> = (3..=9).map(|id| choose("auto", &slurm(id, 3, 9, 1, 7)).unwrap().index).collect();
        assert_eq!(got, (0..7).collect::<Vec<_>>());
        // Count from MAX alone, and STEP unset (1).
        let no_count = [("SLURM_ARRAY_TASK_ID", "4"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_MAX", "8")];
        assert_eq!(Shard::choose("auto", &env_of(&no_count)).unwrap().shard, Shard { index: 3, count: 8 });
    }

    #[test]
    fn irregular_or_inconsistent_slurm_arrays_are_refused() {
        // --array=1,3,7: COUNT 3 but MIN..MAX by STEP 1 would be 7 tasks.
        let e = choose("auto", &slurm(3, 1, 7, 1, 3)).unwrap_err();
        assert!(e.contains("not a range") && e.contains("SLURM_ARRAY_TASK_COUNT=3"), "{e}");
        assert!(choose("auto", &slurm(5, 0, 30, 2, 16)).unwrap_err().contains("not a range"), "an id off the step");
        assert!(choose("auto/8", &slurm(1, 1, 16, 1, 16)).unwrap_err().contains("has 16 tasks"), "auto/N checks the count");
        let e = Shard::choose("auto", &env_of(&[("SLURM_ARRAY_TASK_ID", "2")])).unwrap_err().to_string();
        assert!(e.contains("SLURM_ARRAY_TASK_MIN"), "{e}");
        let e = Shard::choose("auto", &env_of(&[("SLURM_ARRAY_TASK_ID", "x2"), ("SLURM_ARRAY_TASK_MIN", "0")])).unwrap_err().to_string();
        assert!(e.contains("SLURM_ARRAY_TASK_ID=x2 is not a whole number"), "{e}");
    }

    #[test]
    fn kubernetes_indexed_jobs_take_the_count_from_the_flag_or_the_environment() {
        let env = env_of(&[("JOB_COMPLETION_INDEX", "5")]);
        assert_eq!(Shard::choose("auto/16", &env).unwrap().shard, Shard { index: 5, count: 16 });
        let e = Shard::choose("auto", &env).unwrap_err().to_string();
        assert!(e.contains("auto/N") && e.contains("TPUSIM_SHARD_COUNT"), "{e}");
        let env = env_of(&[("JOB_COMPLETION_INDEX", "5"), ("TPUSIM_SHARD_COUNT", "8")]);
        assert_eq!(Shard::choose("auto", &env).unwrap().shard, Shard { index: 5, count: 8 });
        assert!(Shard::choose("auto/4", &env).unwrap_err().to_string().contains("disagrees"));
        let env = env_of(&[("JOB_COMPLETION_INDEX", "9"), ("TPUSIM_SHARD_COUNT", "8")]);
        assert!(Shard::choose("auto", &env).unwrap_err().to_string().contains("not below the shard count 8"));
    }

    #[test]
    fn auto_needs_exactly_one_batch_system_and_explicit_shards_ignore_the_environment() {
        let none = env_of(&[]);
        let e = Shard::choose("auto", &none).unwrap_err().to_string();
        assert!(e.contains("--shard auto") && e.contains("SLURM_ARRAY_TASK_ID") && e.contains("JOB_COMPLETION_INDEX"), "{e}");
        let both = env_of(&[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_MIN", "1"), ("JOB_COMPLETION_INDEX", "0")]);
        assert!(Shard::choose("auto", &both).unwrap_err().to_string().contains("both"));
        let c = Shard::choose("3/4", &both).unwrap();
        assert_eq!((c.shard, c.from), (Shard { index: 3, count: 4 }, None));
        for bad in ["auto/0", "auto/x", "autox", "auto16"] {
            assert!(Shard::choose(bad, &none).is_err(), "{bad}");
        }
    }
}
