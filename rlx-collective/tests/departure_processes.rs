//! Departures of real processes: seeded trials over worlds of 2 to 8 ranks, each rank its own
//! process over TCP on loopback, one rank drawn to leave by exiting cleanly (it drops its
//! group and its process ends), by SIGKILL, or by SIGSTOP (frozen, never ended), either
//! in the middle of the collectives (a random delay after it said it runs) or between
//! operations while every other rank is idle. The survivors run collectives until one fails,
//! shrink, and the new group must hold exactly the survivors and run every collective kind
//! and a point-to-point ring exactly (`common/departure.rs`, shared with the thread form in
//! `departure.rs`).
//!
//! Heartbeats every 250 ms find a frozen rank 1.25 s after its last byte; the operation
//! timeout stays 60 s, so a busy machine never makes a live rank look dead.
//!
//! `DEPARTURE_PROCESS_TRIALS=1000 cargo test -p rlx-collective --test departure_processes`
//! runs the long form (12 trials by default, about 8 s); `DEPARTURE_PROCESS_FIRST=915` starts
//! at that seed, to replay a failed trial.

#![cfg(all(feature = "tcp", unix))]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Child;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread;
use std::time::{Duration, Instant};

use common::Reaper;
use common::checked::{Rng, run_checked};
use common::departure::{self, Departure};
use rlx_collective::{ProcessGroup, Transport};

/// Set in a re-executed copy of this test binary: `rank,world,port,seed`.
const WORKER: &str = "RLX_DEPARTURE_PROCESS_WORKER";
/// The test that re-executes itself, as libtest names it.
const PROCESS_TEST: &str = "a_process_that_leaves_is_left_out_and_the_new_group_is_exact";
/// Generous: only the heartbeats, never this timeout, may find the frozen rank.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// The ranks' heartbeat interval (five of them without a byte lose a peer).
const HEARTBEAT: Duration = Duration::from_millis(250);
/// How long the parent gives one trial.
const BOUND: Duration = Duration::from_secs(120);
/// What a rank prints once its first `before` collectives are done.
const RUNNING: &str = "departure: running";
/// What a survivor prints at the end: the new group's members.
const MEMBERS: &str = "departure: members ";
/// What a rank prints when it could not join the world.
const NO_WORLD: &str = "departure: no world: ";

/// How the leaver leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// It drops its group and its process ends with success.
    Exit,
    /// The parent kills it with SIGKILL.
    Kill,
    /// The parent freezes it with SIGSTOP (and kills it once the trial is over).
    Stop,
}

/// One trial's draw: the shared part, and how and when the rank leaves.
#[derive(Clone, Copy, Debug)]
struct Draw {
    departure: Departure,
    way: Way,
    /// How long after the leaver said it runs the parent signals it (unless idle).
    delay: Duration,
}

impl Draw {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::seeded(seed);
        Draw {
            departure: Departure::draw(seed, &mut rng),
            way: [Way::Exit, Way::Kill, Way::Stop][(seed % 3) as usize],
            delay: Duration::from_micros(rng.below(3000)),
        }
    }
}

impl std::ops::Deref for Draw {
    type Target = Departure;

    fn deref(&self) -> &Departure {
        &self.departure
    }
}

/// A rank's part, in its own process.
fn worker(spec: &str) {
    let fields: Vec<u64> = spec
        .split(',')
        .map(|f| f.parse().expect("a numeric worker field"))
        .collect();
    let [rank, world, port, seed] = fields[..] else {
        panic!("worker spec {spec:?} is not rank,world,port,seed")
    };
    let draw = Draw::new(seed);
    assert_eq!(u64::from(draw.world), world, "the parent's draw");
    let port = u16::try_from(port).expect("a port number");
    let rank = rank as u32;
    let built = common::loopback_builder(rank, draw.world, port, OP_TIMEOUT)
        .heartbeat(HEARTBEAT)
        .build();
    let transport = match built {
        Ok(transport) => transport,
        Err(error) => {
            println!("{NO_WORLD}{error}");
            std::process::exit(2);
        }
    };
    let group = ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>);
    if rank == draw.leaver {
        leave(group, draw);
        return;
    }
    let mut wait_gone = || {
        println!("{RUNNING}");
        read_go();
    };
    let idle = draw.idle.then_some(&mut wait_gone as &mut dyn FnMut());
    let members = departure::survive(&group, draw.seed, draw.before, idle, &draw);
    let members: Vec<String> = members.iter().map(u32::to_string).collect();
    println!("{MEMBERS}{}", members.join(","));
    // Every survivor ends together, once all have checked their new group: one that ended
    // early would close connections the others still read from.
    read_go();
}

/// The leaver's part: its first `before` collectives, then it leaves (an idle trial waits
/// for the parent's go-ahead first). A leaver to be killed or frozen runs the plan on until
/// the signal comes.
fn leave(group: ProcessGroup, draw: Draw) {
    let steps = departure::trial_plan(draw.seed);
    for step in 0..draw.before {
        let (op, len) = departure::step_of(&steps, step);
        run_checked(&group, op, step as u64, len).expect("every rank is still here");
    }
    println!("{RUNNING}");
    if draw.idle {
        read_go();
    }
    if draw.way == Way::Exit {
        drop(group);
        return;
    }
    for step in draw.before.. {
        let (op, len) = departure::step_of(&steps, step);
        if run_checked(&group, op, step as u64, len).is_err() {
            break;
        }
    }
    // The survivors moved on without this rank (it was stopped and resumed, which the parent
    // never does, or they lost it for another reason): wait for the signal.
    read_go();
}

/// Waits for a line on stdin from the parent.
fn read_go() {
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("the go-ahead");
}

/// The running ranks of one trial and the lines they print.
struct Ranks {
    reaper: Reaper,
    lines: Receiver<(usize, String)>,
    /// Every line each rank printed so far.
    seen: Vec<Vec<String>>,
    deadline: Instant,
    draw: Draw,
}

impl Ranks {
    fn spawn(draw: Draw, port: u16) -> Self {
        let mut reaper = Reaper(Vec::new());
        let (tx, lines) = channel();
        for rank in 0..draw.world as usize {
            let spec = format!("{rank},{},{port},{}", draw.world, draw.seed);
            let mut child = common::spawn_worker(PROCESS_TEST, WORKER, spec);
            let out = BufReader::new(child.stdout.take().expect("a worker's stdout"));
            let tx = tx.clone();
            thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    if tx.send((rank, line)).is_err() {
                        return;
                    }
                }
            });
            reaper.0.push(child);
        }
        Ranks {
            reaper,
            lines,
            seen: vec![Vec::new(); draw.world as usize],
            deadline: Instant::now() + BOUND,
            draw,
        }
    }

    /// Waits until every rank of `ranks` has printed a line holding `marker` and returns the
    /// rest of each such line, in the order of `ranks`; `Err` with the error when a rank could
    /// not join the world. Every line is kept, so a rank may print before its turn comes.
    /// libtest prints `test NAME ... ` before a test's first line, so a marker need not start
    /// its line.
    fn expect(&mut self, ranks: &[usize], marker: &str) -> Result<Vec<String>, String> {
        loop {
            if let Some(error) = self.seen.iter().flatten().find_map(|l| after(l, NO_WORLD)) {
                return Err(error);
            }
            let found: Vec<Option<String>> = ranks
                .iter()
                .map(|&r| self.seen[r].iter().find_map(|l| after(l, marker)))
                .collect();
            if found.iter().all(Option::is_some) {
                return Ok(found.into_iter().flatten().collect());
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((rank, line)) => self.seen[rank].push(line),
                Err(RecvTimeoutError::Timeout) => self.fail(&format!("no {marker:?} in time")),
                Err(RecvTimeoutError::Disconnected) => self.fail("every rank's output ended"),
            }
        }
    }

    fn child(&mut self, rank: usize) -> &mut Child {
        &mut self.reaper.0[rank]
    }

    /// Lets `rank` go on with a line on its stdin.
    fn go(&mut self, rank: usize) {
        let sent = self
            .child(rank)
            .stdin
            .as_mut()
            .expect("a worker's stdin")
            .write_all(b"go\n");
        if let Err(e) = sent {
            self.fail(&format!("rank {rank} ended before its go-ahead ({e})"));
        }
    }

    /// Waits for `rank` to end and checks how it ended.
    fn ended(&mut self, rank: usize, success: bool) {
        loop {
            if let Some(status) = self.child(rank).try_wait().expect("a worker's state") {
                if status.success() != success {
                    self.fail(&format!("rank {rank} ended with {status}"));
                }
                return;
            }
            if Instant::now() >= self.deadline {
                self.fail(&format!("rank {rank} is still running"));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Makes the leaver leave the way the draw says.
    fn depart(&mut self) {
        let leaver = self.draw.leaver as usize;
        match self.draw.way {
            Way::Exit => {
                if self.draw.idle {
                    self.go(leaver);
                }
                self.ended(leaver, true);
            }
            Way::Kill => {
                self.child(leaver).kill().expect("SIGKILL");
                self.ended(leaver, false);
            }
            Way::Stop => {
                if common::freeze(self.child(leaver)).is_err() {
                    self.fail("the leaver ended instead of stopping");
                }
            }
        }
    }

    /// Fails the trial with `why`, each rank's standard error and how it ended.
    fn fail(&mut self, why: &str) -> ! {
        let draw = self.draw;
        let mut report = format!("{draw:?}: {why}");
        for (rank, child) in self.reaper.0.iter_mut().enumerate() {
            let status = common::end(child)
                .map(|s| s.to_string())
                .unwrap_or_default();
            let mut err = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut err);
            }
            report.push_str(&format!("\n--- rank {rank} ({status}):\n{err}"));
        }
        panic!("{report}");
    }
}

/// The rest of `line` after `marker`, if it holds it.
fn after(line: &str, marker: &str) -> Option<String> {
    line.find(marker)
        .map(|at| line[at + marker.len()..].to_owned())
}

/// One trial; `Err` with the reason when the world could not be built (its port was taken).
fn trial(draw: Draw) -> Result<(), String> {
    let mut ranks = Ranks::spawn(draw, common::free_port());
    let leaver = draw.leaver as usize;
    let survivors: Vec<usize> = (0..draw.world as usize).filter(|&r| r != leaver).collect();
    if draw.idle {
        let everyone: Vec<usize> = (0..draw.world as usize).collect();
        ranks.expect(&everyone, RUNNING)?;
        ranks.depart();
        for &rank in &survivors {
            ranks.go(rank);
        }
    } else {
        ranks.expect(&[leaver], RUNNING)?;
        if draw.way != Way::Exit {
            thread::sleep(draw.delay);
        }
        ranks.depart();
    }
    let members = ranks.expect(&survivors, MEMBERS)?;
    let want: Vec<String> = survivors.iter().map(usize::to_string).collect();
    let want = want.join(",");
    if let Some((i, got)) = members.iter().enumerate().find(|(_, got)| **got != want) {
        ranks.fail(&format!(
            "rank {} has the new group {got}, not {want}",
            survivors[i]
        ));
    }
    for &rank in &survivors {
        ranks.go(rank);
    }
    for &rank in &survivors {
        ranks.ended(rank, true);
    }
    Ok(())
}

/// How many trials run: `DEPARTURE_PROCESS_TRIALS`, else 12 (four of each way of leaving).
fn trials() -> u64 {
    env_number("DEPARTURE_PROCESS_TRIALS").unwrap_or(12)
}

/// The number in environment variable `name`, if it holds one.
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

#[test]
fn a_process_that_leaves_is_left_out_and_the_new_group_is_exact() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let first = env_number("DEPARTURE_PROCESS_FIRST").unwrap_or(0);
    for seed in first..first + trials() {
        let draw = Draw::new(seed);
        // A rendezvous port taken between the picker and the bind (see `common::tcp_world`)
        // costs the trial a second start, never its verdict.
        let mut tries = 0;
        while let Err(why) = trial(draw) {
            tries += 1;
            assert!(
                why.contains("Address already in use") && tries < 3,
                "{draw:?}: a rank could not join the world: {why}"
            );
        }
    }
}
