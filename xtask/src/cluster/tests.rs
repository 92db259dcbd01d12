//! The launcher against scripted ranks: shell processes that print the events a real rank
//! would (or hang, or die), so that every verdict is checked without building anything.

use std::time::{Duration, Instant};

use super::events::{CaseRecord, ErrorRecord, Event};
use super::fault::{Fault, FaultKind};
use super::{ClusterArgs, supervise, worker};
use crate::job::ChildSpec;

fn case(rank: u32, index: u64, passed: bool) -> String {
    Event::Case {
        rank,
        case: CaseRecord {
            index,
            op: "all_reduce".to_owned(),
            dtype: "f32".to_owned(),
            reduce: "sum".to_owned(),
            count: 7,
            name: format!("all_reduce/f32/sum/n=7/case{index}"),
            passed,
            detail: if passed {
                String::new()
            } else {
                "element 3: got 1, want 2".to_owned()
            },
            micros: 5,
        },
    }
    .to_line()
}

fn start(rank: u32) -> String {
    Event::Start {
        rank,
        group: 0,
        name: "all_reduce f32 n=7".to_owned(),
    }
    .to_line()
}

fn failed(rank: u32, kind: &str, peer: u32) -> String {
    Event::Failed {
        rank,
        error: ErrorRecord {
            kind: kind.to_owned(),
            peer: Some(peer),
            message: format!("{kind} naming rank {peer}"),
            during: None,
        },
    }
    .to_line()
}

/// A rank that prints `lines`, then does `then` (a shell command, e.g. waiting on stdin).
fn scripted(rank: u32, lines: &[String], then: &str) -> ChildSpec {
    let mut script = String::new();
    for line in lines {
        script.push_str(&format!("printf '%s\\n' '{line}'; "));
    }
    script.push_str(then);
    ChildSpec::new(format!("rank {rank}"), "sh").args(["-c".to_owned(), script])
}

fn args(ranks: u32, timeout: u64) -> ClusterArgs {
    ClusterArgs {
        ranks,
        timeout,
        ..ClusterArgs::ci()
    }
}

fn done(rank: u32, failed: u64) -> String {
    Event::Done {
        rank,
        passed: 1 - failed,
        failed,
    }
    .to_line()
}

const WAIT_FOR_EOF: &str = "cat > /dev/null";

fn shrunk(rank: u32, members: &[u32]) -> String {
    Event::Shrunk {
        rank,
        error: ErrorRecord {
            kind: "peer_lost".to_owned(),
            peer: Some(2),
            message: "peer_lost naming rank 2".to_owned(),
            during: None,
        },
        members: members.to_vec(),
        micros: 400,
    }
    .to_line()
}

#[test]
fn a_shrink_passes_only_when_every_survivor_holds_the_survivors_and_passes_after() {
    let fault = Fault {
        kind: FaultKind::Kill,
        target: "2@0".parse().unwrap(),
    };
    let victim = Event::Fault {
        rank: 2,
        kind: "kill".to_owned(),
        index: 0,
    }
    .to_line();
    let after = worker::SHRUNK_CASE_BASE;
    let run = |members_of_1: &[u32], passed_after: bool| {
        let survivor = |rank: u32, members: &[u32], passed: bool| {
            scripted(
                rank,
                &[
                    start(rank),
                    shrunk(rank, members),
                    case(rank, after, passed),
                    done(rank, u64::from(!passed)),
                ],
                WAIT_FOR_EOF,
            )
        };
        let specs = [
            survivor(0, &[0, 1], true),
            survivor(1, members_of_1, passed_after),
            scripted(2, &[start(2), victim.clone()], "sleep 30"),
        ];
        let args = ClusterArgs {
            kill: Some("2@0".parse().unwrap()),
            shrink: true,
            ..args(3, 20)
        };
        supervise(&args, None, &specs, Some(&fault), None, None)
    };
    run(&[0, 1], true).unwrap();
    let err = run(&[0, 1, 2], true).unwrap_err();
    assert!(err.contains("SHRINK: rank 1's new group"), "{err}");
    let err = run(&[0, 1], false).unwrap_err();
    assert!(err.contains("WRONG"), "{err}");
}

#[test]
fn a_clean_run_passes() {
    let specs: Vec<ChildSpec> = (0..2)
        .map(|r| scripted(r, &[start(r), case(r, 0, true), done(r, 0)], WAIT_FOR_EOF))
        .collect();
    supervise(&args(2, 20), None, &specs, None, None, None).unwrap();
}

#[test]
fn a_wrong_byte_on_one_rank_fails_the_run() {
    let specs = [
        scripted(0, &[start(0), case(0, 0, true), done(0, 0)], WAIT_FOR_EOF),
        scripted(1, &[start(1), case(1, 0, false), done(1, 1)], WAIT_FOR_EOF),
    ];
    let err = supervise(&args(2, 20), None, &specs, None, None, None).unwrap_err();
    assert!(
        err.contains("WRONG: all_reduce/f32/sum/n=7/case0 on rank 1"),
        "{err}"
    );
}

/// The global timeout is long enough for every rank's first line to arrive however loaded
/// the machine is (a rank still silent at the timeout would be named "before its first
/// case"), and far below the ranks' own hang: a launcher without the bound would wait a
/// minute for them, this one must be done a few seconds after the timeout. The ranks `exec`
/// their sleep, so that the launcher's kill ends it instead of leaving it running for a
/// minute behind a killed shell.
#[test]
fn a_hang_is_bounded_by_the_global_timeout_and_names_the_operation() {
    let timeout = 5;
    let specs = [
        scripted(0, &[start(0), case(0, 0, true)], "exec sleep 60"),
        scripted(1, &[start(1)], "exec sleep 60"),
    ];
    let began = Instant::now();
    let err = supervise(&args(2, timeout), None, &specs, None, None, None).unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(timeout + 15), "{err}");
    for rank in 0..2 {
        let hang = format!("HANG: rank {rank} still running in all_reduce f32 n=7");
        assert!(err.contains(&hang), "{err}");
    }
}

#[test]
fn a_crash_ends_the_run_long_before_the_global_timeout() {
    let specs = [
        scripted(0, &[start(0)], "sleep 60"),
        scripted(1, &[start(1)], "exit 3"),
    ];
    let began = Instant::now();
    let mut quick = args(2, 300);
    quick.fault_bound = 1;
    let err = supervise(&quick, None, &specs, None, None, None).unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(20), "{err}");
    assert!(
        err.contains("HANG: rank 0 still running in all_reduce f32 n=7"),
        "{err}"
    );
    assert!(
        err.contains("CRASH: rank 1 exited without a report"),
        "{err}"
    );
}

#[test]
fn a_kill_passes_only_with_the_right_errors() {
    let fault = Fault {
        kind: FaultKind::Kill,
        target: "1@0".parse().unwrap(),
    };
    let victim = Event::Fault {
        rank: 1,
        kind: "kill".to_owned(),
        index: 0,
    }
    .to_line();
    let run = |survivor_error: String| {
        let specs = [
            scripted(0, &[start(0), survivor_error], WAIT_FOR_EOF),
            scripted(1, &[start(1), victim.clone()], "sleep 30"),
        ];
        supervise(&args(2, 20), None, &specs, Some(&fault), None, None)
    };
    run(failed(0, "peer_lost", 1)).unwrap();
    for wrong in [failed(0, "timeout", 1), failed(0, "peer_lost", 0)] {
        let err = run(wrong).unwrap_err();
        assert!(err.contains("FAULT: rank 0"), "{err}");
    }
}

#[test]
fn a_stalled_rank_is_resumed_once_the_survivors_report_and_must_fail_too() {
    let fault = Fault {
        kind: FaultKind::Stall,
        target: "1@0".parse().unwrap(),
    };
    let stalled = Event::Fault {
        rank: 1,
        kind: "stall".to_owned(),
        index: 0,
    }
    .to_line();
    let run = |after_resume: String| {
        // The victim stops itself as a real rank does; it only goes on once resumed.
        let then = format!("kill -STOP $$; printf '%s\\n' '{after_resume}'; {WAIT_FOR_EOF}");
        let specs = [
            scripted(0, &[start(0), failed(0, "timeout", 1)], WAIT_FOR_EOF),
            scripted(1, &[start(1), stalled.clone()], &then),
        ];
        let args = ClusterArgs {
            stall: Some("1@0".parse().unwrap()),
            ..args(2, 20)
        };
        supervise(&args, None, &specs, Some(&fault), Some(100), None)
    };
    run(failed(1, "peer_lost", 0)).unwrap();
    let err = run(done(1, 0)).unwrap_err();
    assert!(err.contains("RESUME: rank 1 reported success"), "{err}");
}
