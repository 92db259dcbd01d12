//! The symmetric heap over real TCP between real processes: [`Symmetric`] wrapping the
//! `rlx-net` transport that the Thunderbolt transport is built on, with the ranks as child
//! processes of this test over loopback.
//!
//! The binary is its own runner (`harness = false`): without `RLX_HEAP_TEST_SCENARIO` it is the
//! parent, which starts every scenario's ranks as copies of itself and checks that each exits
//! successfully; with it, it is one rank of that scenario.

mod heap_model;
mod trials;

use heap_model::check;

use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rlx_net::TcpTransport;
use rlx_transport::symmetric::{Completion, SymmetricTransport};
use rlx_transport::{CollectiveError, Result, Symmetric, Transport};

type Rank = Symmetric<TcpTransport>;

const SCENARIO_ENV: &str = "RLX_HEAP_TEST_SCENARIO";
const RANK_ENV: &str = "RLX_HEAP_TEST_RANK";
const PORT_ENV: &str = "RLX_HEAP_TEST_PORT";
const DEADLINE: Duration = Duration::from_secs(180);

/// A scenario: its name, its world size, its heap size and what each rank does.
struct Scenario {
    name: &'static str,
    world: u32,
    heap_size: u64,
    body: fn(&Rank) -> Result<()>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "signals_atomics_and_remote_errors",
        world: 3,
        heap_size: 1 << 16,
        body: signals_atomics_and_remote_errors,
    },
    Scenario {
        name: "mutual_64_mib_gets",
        world: 2,
        heap_size: (64 << 20) + 4096,
        body: mutual_64_mib_gets,
    },
    Scenario {
        name: "random_operations_match_each_ranks_model",
        world: 3,
        heap_size: 1 << 16,
        body: random_operations_match_each_ranks_model,
    },
];

fn signals_atomics_and_remote_errors(t: &Rank) -> Result<()> {
    let n = t.world_size();
    let me = t.rank();
    let slots = t.alloc(u64::from(n) * 64)?;
    let flag = t.alloc(8)?;
    let counter = t.alloc(8)?;
    let next = (me + 1) % n;
    heap_model::ring_put_signal(t, slots, flag)?;
    let old = t.fetch_add(0, counter.offset(), 1 << me)?;
    check(old & (1 << me) == 0, || {
        format!("rank {me} found its own bit in {old:#x}")
    })?;
    let size = t.heap().size();
    match t.put(next, size - 4, &[0u8; 8]) {
        Err(CollectiveError::OutOfBounds {
            rank,
            offset,
            len: 8,
            heap_size,
        }) if rank == next && offset == size - 4 && heap_size == size => {}
        other => {
            return Err(CollectiveError::invalid(format!(
                "out-of-bounds put gave {other:?}"
            )));
        }
    }
    t.barrier()?;
    let total = t.get_nbi(0, counter.offset(), 8)?.wait()?;
    let total = u64::from_le_bytes(total.try_into().unwrap_or_default());
    check(total == (1 << n) - 1, || format!("counter is {total:#x}"))?;
    t.barrier()
}

fn mutual_64_mib_gets(t: &Rank) -> Result<()> {
    const LEN: u64 = 64 << 20;
    let region = t.alloc(LEN)?;
    let me = t.rank() as u8;
    let pattern = |rank: u8, i: usize| (i as u8).wrapping_mul(29) ^ rank.wrapping_mul(77);
    let mine: Vec<u8> = (0..LEN as usize).map(|i| pattern(me, i)).collect();
    t.heap().write(region.offset(), &mine)?;
    drop(mine);
    t.barrier()?;
    let peer = 1 - t.rank();
    let mut theirs = vec![0u8; LEN as usize];
    t.get(peer, region.offset(), &mut theirs)?;
    let peer = peer as u8;
    let wrong = theirs
        .iter()
        .enumerate()
        .position(|(i, &b)| b != pattern(peer, i));
    check(wrong.is_none(), || {
        format!("rank {me}: byte {wrong:?} from rank {peer} is wrong")
    })?;
    t.barrier()
}

fn random_operations_match_each_ranks_model(t: &Rank) -> Result<()> {
    heap_model::random_operations(t, 1500)
}

fn run_rank(scenario: &Scenario) -> Result<()> {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| CollectiveError::config(format!("{name} missing")))
    };
    let rank = env(RANK_ENV)?;
    let port = u16::try_from(env(PORT_ENV)?).map_err(|_| CollectiveError::config("bad port"))?;
    let tcp = TcpTransport::builder()
        .rank(rank)
        .world_size(scenario.world)
        .master("127.0.0.1", port)
        .op_timeout(Duration::from_secs(120))
        .build()?;
    let symmetric = Symmetric::new(Arc::new(tcp), scenario.heap_size)?;
    (scenario.body)(&symmetric)
}

/// A loopback port below the ephemeral range (see `rlx_transport::ports`).
fn free_port() -> u16 {
    rlx_transport::ports::free_loopback_ports(1).expect("a free loopback port")[0]
}

/// Starts the ranks of `scenario` and waits for them; kills them all at the deadline.
fn run_scenario(scenario: &Scenario) -> std::result::Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port().to_string();
    let mut ranks: Vec<Child> = Vec::new();
    for rank in 0..scenario.world {
        let child = Command::new(&exe)
            .env(SCENARIO_ENV, scenario.name)
            .env(RANK_ENV, rank.to_string())
            .env(PORT_ENV, &port)
            .spawn()
            .map_err(|e| format!("spawn rank {rank}: {e}"))?;
        ranks.push(child);
    }
    let start = Instant::now();
    let mut failures = Vec::new();
    let mut pending: Vec<(u32, Child)> = (0..scenario.world).zip(ranks).collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (rank, mut child) in pending {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => failures.push(format!("rank {rank} exited with {status}")),
                Ok(None) if start.elapsed() > DEADLINE => {
                    let _ = child.kill();
                    let _ = child.wait();
                    failures.push(format!("rank {rank} still running after {DEADLINE:?}"));
                }
                Ok(None) => still.push((rank, child)),
                Err(e) => failures.push(format!("rank {rank}: {e}")),
            }
        }
        pending = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn main() -> ExitCode {
    if let Ok(name) = std::env::var(SCENARIO_ENV) {
        let Some(scenario) = SCENARIOS.iter().find(|s| s.name == name) else {
            eprintln!("unknown scenario {name}");
            return ExitCode::FAILURE;
        };
        return match run_rank(scenario) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("scenario {name}: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let tests = SCENARIOS.iter().map(|scenario| {
        libtest_mimic::Trial::test(scenario.name, move || {
            run_scenario(scenario).map_err(libtest_mimic::Failed::from)
        })
    });
    trials::run(tests.collect())
}
