//! CSV input for the data-driven figures (sweep, heatmap, validation): a header row, then one
//! row per record; columns are chosen by name. Read with the `csv` crate (RFC 4180: quoted
//! fields may hold commas, doubled quotes and line breaks); blank lines and lines starting with
//! `#` are skipped.

use crate::PlotError;

/// A CSV file read into memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Path it was read from (for error messages).
    pub path: String,
    /// Column names from the header row.
    pub header: Vec<String>,
    /// Records as (line number in the file, fields).
    pub rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    /// Parses CSV text.
    ///
    /// # Errors
    /// [`PlotError`] naming `flag`, the path and the line for an empty file, an unterminated
    /// quote or a row whose field count differs from the header.
    pub fn parse(text: &str, path: &str, flag: &str) -> Result<Self, PlotError> {
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let mut lines = tpusim_io::CsvLines::new(text);
        let mut line_at = |byte: u64| lines.line_at(byte) as usize;
        let mut header: Option<Vec<String>> = None;
        let mut rows = Vec::new();
        for rec in rdr.records() {
            let rec = rec.map_err(|e| {
                let line = e.position().map(|p| line_at(p.byte())).unwrap_or(0);
                PlotError::Input(format!("{flag} {path} line {line}: malformed CSV: {e}"))
            })?;
            let line = rec.position().map(|p| line_at(p.byte())).unwrap_or(0);
            let fields: Vec<String> = rec.iter().map(String::from).collect();
            if fields.iter().all(|f| f.is_empty()) {
                continue;
            }
            match &header {
                None => header = Some(fields),
                Some(h) => {
                    if fields.len() != h.len() {
                        return Err(PlotError::Input(format!(
                            "{flag} {path} line {line}: {} fields but the header has {} columns",
                            fields.len(),
                            h.len()
                        )));
                    }
                    rows.push((line, fields));
                }
            }
        }
        let header = header.ok_or_else(|| PlotError::Input(format!("{flag} {path}: empty file (expected a CSV header row)")))?;
        Ok(Table { path: path.to_string(), header, rows })
    }

    /// Reads and parses a CSV file.
    ///
    /// # Errors
    /// [`PlotError`] naming `flag` and the path when the file cannot be read or parsed.
    pub fn read(path: &str, flag: &str) -> Result<Self, PlotError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlotError::Input(format!("{flag} {path}: cannot read: {e}")))?;
        Self::parse(&text, path, flag)
    }

    /// Index of the column `name`, chosen by `flag`.
    ///
    /// # Errors
    /// [`PlotError`] naming the flag, the column, the file and the columns it has.
    pub fn col(&self, name: &str, flag: &str) -> Result<usize, PlotError> {
        self.header.iter().position(|h| h == name).ok_or_else(|| {
            PlotError::Input(format!("{flag} {name}: no such column in {} (columns: {})", self.path, self.header.join(", ")))
        })
    }

    /// Whether the table has a column.
    pub fn has(&self, name: &str) -> bool {
        self.header.iter().any(|h| h == name)
    }

    /// The field of a row (empty when the row is short).
    pub fn get<'a>(&self, row: &'a [String], col: usize) -> &'a str {
        row.get(col).map(String::as_str).unwrap_or("")
    }

    /// The numeric value of a field: `Ok(None)` when the field is empty.
    ///
    /// # Errors
    /// [`PlotError`] naming the file, line and column when the field is not a number.
    pub fn num(&self, line: usize, row: &[String], col: usize) -> Result<Option<f64>, PlotError> {
        let s = self.get(row, col);
        if s.is_empty() {
            return Ok(None);
        }
        s.parse::<f64>()
            .map(Some)
            .map_err(|_| PlotError::Input(format!("{} line {line}: column {} = {s:?} is not a number", self.path, self.header[col])))
    }

    /// Rows passing every `COL=VALUE` filter (string equality, or numeric equality when both
    /// sides are numbers).
    ///
    /// # Errors
    /// [`PlotError`] naming `--where` for a filter without `=` or naming an unknown column.
    pub fn filtered(&self, filters: &[String]) -> Result<Vec<(usize, &[String])>, PlotError> {
        let mut fs = Vec::new();
        for f in filters {
            let (k, v) =
                f.split_once('=').ok_or_else(|| PlotError::Input(format!("--where {f}: expected COLUMN=VALUE, e.g. traversal=compact")))?;
            fs.push((self.col(k.trim(), "--where")?, v.trim().to_string()));
        }
        let hit = |r: &[String], c: usize, v: &str| {
            let got = self.get(r, c);
            got == v || matches!((got.parse::<f64>(), v.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
        };
        // A filter no row matches names itself and the values its column holds.
        for (f, (c, v)) in filters.iter().zip(&fs) {
            if !self.rows.is_empty() && !self.rows.iter().any(|(_, r)| hit(r, *c, v)) {
                let mut values: Vec<&str> = Vec::new();
                for (_, r) in &self.rows {
                    let got = self.get(r, *c);
                    if !values.contains(&got) {
                        values.push(got);
                    }
                }
                let more = if values.len() > 12 { format!(", ... ({} values)", values.len()) } else { String::new() };
                values.truncate(12);
                return Err(PlotError::Input(format!(
                    "--where {f}: no row of {} has it; column {} holds {}{more}",
                    self.path,
                    self.header[*c],
                    values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Ok(self.rows.iter().filter(|(_, r)| fs.iter().all(|(c, v)| hit(r, *c, v))).map(|(l, r)| (*l, r.as_slice())).collect())
    }
}

/// A row left out of a figure for a value it cannot draw (`--skip-bad`): its line in the file,
/// the column and the value as the file gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// 1-based line of the row in the file.
    pub line: usize,
    /// The column whose value the figure cannot draw.
    pub column: String,
    /// The value as the file gives it (`NaN`, `inf`, `-1`).
    pub value: String,
}

/// Rows with values a figure cannot draw: refused, naming the first, or with `skip` recorded
/// and left out (`--skip-bad`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BadRows {
    /// Leave such rows out instead of refusing them.
    pub skip: bool,
    /// The rows left out, in file order.
    pub skipped: Vec<BadRow>,
}

impl BadRows {
    /// Checks the value `v` of column `col` of the row at `line`: when `ok(v)` fails, refuses it
    /// (an error naming the file, line, the row's `at` (`block_q = 512, block_kv = 1024`), the
    /// column, the value, what is `allowed` and `--skip-bad`) or, with `skip`, records it and
    /// returns `Ok(false)`.
    ///
    /// # Errors
    /// [`PlotError::Input`] for a value `ok` refuses, without `skip`.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        t: &Table,
        line: usize,
        row: &[String],
        col: usize,
        v: f64,
        ok: impl Fn(f64) -> bool,
        allowed: &str,
        at: impl FnOnce() -> String,
    ) -> Result<bool, PlotError> {
        if ok(v) {
            return Ok(true);
        }
        let bad = BadRow { line, column: t.header[col].clone(), value: t.get(row, col).to_string() };
        if self.skip {
            self.skipped.push(bad);
            return Ok(false);
        }
        let at = at();
        Err(PlotError::Input(format!(
            "--input {} line {line}{}: {} = {}: {allowed}; correct or remove the row, or give --skip-bad to leave such rows out (the figure's footnote lists them)",
            t.path,
            if at.is_empty() { String::new() } else { format!(" ({at})") },
            bad.column,
            bad.value
        )))
    }

    /// What a figure's source line adds after its row count: `, 2 of them skipped with
    /// --skip-bad` (empty when none was).
    pub fn of_them(&self) -> String {
        if self.skipped.is_empty() {
            String::new()
        } else {
            format!(", {} of them skipped with --skip-bad", self.skipped.len())
        }
    }

    /// The footnote (and stderr note) of the rows left out, `None` when none was:
    /// `--skip-bad left out 2 rows: line 3 (latency_ms = NaN), line 7 (latency_ms = -1)`.
    pub fn note(&self) -> Option<String> {
        const SHOWN: usize = 8;
        if self.skipped.is_empty() {
            return None;
        }
        let n = self.skipped.len();
        let mut list: Vec<String> = self.skipped.iter().take(SHOWN).map(|b| format!("line {} ({} = {})", b.line, b.column, b.value)).collect();
        if n > SHOWN {
            list.push(format!("and {} more", n - SHOWN));
        }
        Some(format!("--skip-bad left out {n} row{} with a value the figure cannot draw: {}.", if n == 1 { "" } else { "s" }, list.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quotes_and_comments() {
        let t = Table::parse("a,b,c\n# note\n1,\"x, y\",\"say \"\"hi\"\"\"\n\n2,3,\n", "f.csv", "--input").unwrap();
        assert_eq!(t.header, vec!["a", "b", "c"]);
        assert_eq!(t.rows[0].1, vec!["1", "x, y", "say \"hi\""]);
        assert_eq!(t.rows[1].0, 5);
        assert_eq!(t.get(&t.rows[1].1, 2), "");
        let e = Table::parse("a,b,c\n2,3\n", "f.csv", "--input").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("2 fields"), "{e}");
    }

    #[test]
    fn a_filter_that_matches_no_row_names_the_values_present() {
        let t = Table::parse("mask_source,x\ncomputed,1\nloaded,2\nloaded,3\n", "f.csv", "--input").unwrap();
        let e = t.filtered(&["mask_source=lodead".into()]).unwrap_err().to_string();
        assert!(e.contains("--where mask_source=lodead: no row of f.csv has it; column mask_source holds \"computed\", \"loaded\""), "{e}");
        assert_eq!(t.filtered(&["mask_source=loaded".into()]).unwrap().len(), 2);
    }

    #[test]
    fn errors_name_file_column_and_line() {
        let t = Table::parse("a,b\n1,zz\n", "f.csv", "--input").unwrap();
        let e = t.col("c", "--y").unwrap_err().to_string();
        assert!(e.contains("--y c") && e.contains("f.csv") && e.contains("a, b"), "{e}");
        let e = t.num(2, &t.rows[0].1, 1).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("column b"), "{e}");
        let e = Table::parse("", "f.csv", "--input").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = Table::read("/nonexistent/x.csv", "--input").unwrap_err().to_string();
        assert!(e.contains("--input /nonexistent/x.csv") && e.contains("cannot read"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_or_listed() {
        let t = Table::parse("a,b\n1,NaN\n2,-1\n3,4\n", "f.csv", "--input").unwrap();
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        let mut bad = BadRows::default();
        let e = bad.check(&t, 2, &t.rows[0].1, 1, f64::NAN, finite, "a finite number >= 0", || "a = 1".into()).unwrap_err().to_string();
        assert!(e.contains("f.csv line 2 (a = 1): b = NaN: a finite number >= 0") && e.contains("--skip-bad"), "{e}");
        let mut bad = BadRows { skip: true, ..Default::default() };
        assert!(!bad.check(&t, 2, &t.rows[0].1, 1, f64::NAN, finite, "", String::new).unwrap());
        assert!(!bad.check(&t, 3, &t.rows[1].1, 1, -1.0, finite, "", String::new).unwrap());
        assert!(bad.check(&t, 4, &t.rows[2].1, 1, 4.0, finite, "", String::new).unwrap());
        assert_eq!(bad.note().unwrap(), "--skip-bad left out 2 rows with a value the figure cannot draw: line 2 (b = NaN), line 3 (b = -1).");
        assert_eq!(BadRows::default().note(), None);
    }

    #[test]
    fn filters() {
        let t = Table::parse("a,b\n1,x\n1.0,y\n2,x\n", "f.csv", "--input").unwrap();
        assert_eq!(t.filtered(&["a=1".into()]).unwrap().len(), 2);
        assert_eq!(t.filtered(&["b=x".into(), "a=2".into()]).unwrap().len(), 1);
        assert!(t.filtered(&["q=1".into()]).unwrap_err().to_string().contains("--where q"));
    }
}
