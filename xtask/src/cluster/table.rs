//! The final test-cluster table: every case's outcome merged over the ranks, printed as one
//! row per operation × dtype × reduction with one column per element count.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::events::CaseRecord;

/// One case merged over the ranks that reported it.
#[derive(Debug, Clone)]
pub(crate) struct MergedCase {
    /// The case as the first reporting rank described it.
    pub(crate) case: CaseRecord,
    /// Ranks that reported it.
    pub(crate) ranks: BTreeSet<u32>,
    /// Ranks on which it failed, with their detail.
    pub(crate) failures: BTreeMap<u32, String>,
    /// Slowest rank's time, in microseconds.
    pub(crate) micros: u64,
}

impl MergedCase {
    /// Whether the case passed on every rank that ran it.
    pub(crate) fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Merges per-rank records by case index.
pub(crate) fn merge<'a>(
    records: impl IntoIterator<Item = (u32, &'a CaseRecord)>,
) -> Vec<MergedCase> {
    let mut merged: BTreeMap<u64, MergedCase> = BTreeMap::new();
    for (rank, record) in records {
        let entry = merged.entry(record.index).or_insert_with(|| MergedCase {
            case: record.clone(),
            ranks: BTreeSet::new(),
            failures: BTreeMap::new(),
            micros: 0,
        });
        entry.ranks.insert(rank);
        entry.micros = entry.micros.max(record.micros);
        if !record.passed {
            entry.failures.insert(rank, record.detail.clone());
        }
    }
    merged.into_values().collect()
}

/// The name of a case's row: operation, dtype, reduction. The algorithms and roots of one row
/// share its cells: a cell passes only if every one of them passed on every rank.
fn row_key(case: &CaseRecord) -> (String, String, String) {
    (case.op.clone(), case.dtype.clone(), case.reduce.clone())
}

/// A row's cells (count → passed everywhere) and its total time in microseconds.
type Cells = (BTreeMap<u64, bool>, u64);

/// Renders the table; `world` is the number of ranks every case should have been reported by.
pub(crate) fn render(cases: &[MergedCase], world: u32) -> String {
    let counts: BTreeSet<u64> = cases.iter().map(|c| c.case.count).collect();
    // Rows keep the order in which their first case ran (the plan's order: collective, dtype,
    // reduction), which reads better than an alphabetical sort.
    let mut rows: Vec<((String, String, String), Cells)> = Vec::new();
    for case in cases {
        let key = row_key(&case.case);
        let position = match rows.iter().position(|(k, _)| *k == key) {
            Some(position) => position,
            None => {
                rows.push((key, Cells::default()));
                rows.len() - 1
            }
        };
        let row = &mut rows[position].1;
        let complete = case.ranks.len() as u32 == world;
        let cell = row.0.entry(case.case.count).or_insert(true);
        *cell &= case.passed() && complete;
        row.1 += case.micros;
    }
    let op_width = rows
        .iter()
        .map(|(k, _)| k.0.len())
        .max()
        .unwrap_or(2)
        .max(9);
    let mut out = String::new();
    let _ = write!(
        out,
        "{:<op_width$} {:>5} {:>5}",
        "operation", "dtype", "redop"
    );
    for count in &counts {
        let _ = write!(out, " {:>7}", format!("n={count}"));
    }
    let _ = writeln!(out, " {:>10}", "time(ms)");
    for ((op, dtype, reduce), (cells, micros)) in &rows {
        let _ = write!(out, "{op:<op_width$} {dtype:>5} {reduce:>5}");
        for count in &counts {
            let cell = match cells.get(count) {
                Some(true) => "ok",
                Some(false) => "FAIL",
                None => ".",
            };
            let _ = write!(out, " {cell:>7}");
        }
        let _ = writeln!(out, " {:>10.1}", *micros as f64 / 1000.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: u64, op: &str, count: u64, passed: bool, micros: u64) -> CaseRecord {
        CaseRecord {
            index,
            op: op.to_owned(),
            dtype: "f32".to_owned(),
            reduce: "sum".to_owned(),
            count,
            name: format!("{op}/f32/sum/n={count}"),
            passed,
            detail: if passed {
                String::new()
            } else {
                "byte 3 differs".to_owned()
            },
            micros,
        }
    }

    #[test]
    fn merging_keeps_failures_and_the_slowest_time() {
        let a = record(0, "all_reduce", 7, true, 10);
        let b = record(0, "all_reduce", 7, false, 30);
        let merged = merge([(0, &a), (1, &b)]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].micros, 30);
        assert!(!merged[0].passed());
        assert_eq!(merged[0].failures.keys().copied().collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn table_marks_failed_and_incomplete_cells() {
        let ok = record(0, "all_reduce", 1, true, 1000);
        let bad = record(1, "all_reduce", 7, false, 1000);
        let lonely = record(2, "broadcast", 1, true, 1000);
        let merged = merge([(0, &ok), (1, &ok), (0, &bad), (1, &bad), (0, &lonely)]);
        let table = render(&merged, 2);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("n=1") && lines[0].contains("n=7"));
        assert!(
            lines[1].starts_with("all_reduce")
                && lines[1].contains("ok")
                && lines[1].contains("FAIL")
        );
        // The broadcast ran on one rank of two: not a pass.
        assert!(lines[2].starts_with("broadcast") && lines[2].contains("FAIL"));
    }
}
