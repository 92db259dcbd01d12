//! The bodies of the fuzz targets over this crate's parsers and decoders, and the replay of a
//! checked-in seed corpus.
//!
//! Each target is a function from arbitrary bytes to a [`Verdict`]: it feeds the bytes to one
//! parser or decoder and checks what must hold of its answer (whatever it accepts encodes back
//! to the same bytes or to an equal value, accepted values are within their documented limits).
//! The `cargo fuzz` targets of the repository's `fuzz/` crate call these functions, and so do
//! ordinary tests that [`replay`] the seed corpus under `fuzz/corpus/<target>/`, so both run
//! the same code. A panic inside a target is a bug of the code under test; an `Err` is a
//! property that does not hold, with a sentence saying which.
//!
//! Not a stable API: hidden from the documentation, for the fuzz crate and the replay tests.

use std::path::{Path, PathBuf};

use crate::bootstrap::{LaunchEnv, Rendezvous, parse_hostfile, split_host_port};
use crate::ifname::IfnameFilter;
use crate::symmetric::wire;
use crate::{FAILURE_WIRE_LEN, Failure};

/// What a fuzz target found: `Ok` when every property held, else the property that failed.
pub type Verdict = Result<(), String>;

/// A fuzz target's body, as [`replay`] calls it.
pub type Target = fn(&[u8]) -> Verdict;

/// `Err(why)` unless `holds`.
pub fn check(holds: bool, why: impl FnOnce() -> String) -> Verdict {
    if holds { Ok(()) } else { Err(why()) }
}

/// The repository's `fuzz/corpus/` directory, where each target's seed corpus lives in a
/// directory named after it. Found from this crate's source directory, so it is only meant for
/// tests run from the repository.
pub fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// [`replay`] of the seed corpus of the target called `name` (under [`corpus_root`]).
pub fn replay_corpus(name: &str, target: Target) -> Result<usize, String> {
    replay(&corpus_root().join(name), target).map_err(|why| format!("{name}: {why}"))
}

/// Runs `target` over every file of the corpus directory `dir`; returns how many inputs ran,
/// or the first file whose input failed a property or panicked (named, with the reason). An
/// empty or missing directory is an error: a replay that runs nothing proves nothing.
pub fn replay(dir: &Path, target: Target) -> Result<usize, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("corpus {}: {e}", dir.display()))?;
    let mut paths: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(format!("corpus {} holds no input", dir.display()));
    }
    for path in &paths {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let verdict = std::panic::catch_unwind(|| target(&bytes))
            .map_err(|panic| {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                format!("panicked: {text}")
            })
            .and_then(|verdict| verdict);
        verdict.map_err(|why| format!("{}: {why}", path.display()))?;
    }
    Ok(paths.len())
}

/// One input of a seed corpus: the target it is for, a file name, and the bytes.
pub type Seed = (&'static str, String, Vec<u8>);

/// A seed corpus being gathered, a target's seeds at a time (see each crate's `seeds`).
#[derive(Debug, Default)]
pub struct Corpus(Vec<Seed>);

impl Corpus {
    /// Adds seed `name` of fuzz target `target`.
    pub fn add(&mut self, target: &'static str, name: &str, bytes: Vec<u8>) {
        self.0.push((target, name.to_owned(), bytes));
    }

    /// The seeds, in the order they were added.
    pub fn into_seeds(self) -> Vec<Seed> {
        self.0
    }
}

/// Writes `seeds` under `corpus` (`corpus/<target>/<name>`), replacing files of the same name.
pub fn write_seeds(corpus: &Path, seeds: &[Seed]) -> std::io::Result<()> {
    for (target, name, bytes) in seeds {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// Checks that every seed in `seeds` is in `corpus` (`corpus/<target>/<name>`) with exactly
/// its bytes, so that a changed encoder cannot leave the replayed corpus behind; with
/// `RLX_WRITE_FUZZ_SEEDS=1` in the environment it rewrites them instead.
pub fn check_or_write_seeds(corpus: &Path, seeds: &[Seed]) -> Result<(), String> {
    if std::env::var_os(crate::env::WRITE_FUZZ_SEEDS).is_some_and(|v| v == "1") {
        return write_seeds(corpus, seeds).map_err(|e| format!("writing the seeds: {e}"));
    }
    let stale: Vec<String> = seeds
        .iter()
        .filter(|(target, name, bytes)| {
            std::fs::read(corpus.join(target).join(name))
                .ok()
                .as_deref()
                != Some(bytes)
        })
        .map(|(target, name, _)| format!("{target}/{name}"))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    Err(format!(
        "seeds missing or differing from what the encoders produce: {stale:?}; rewrite them with \
         RLX_WRITE_FUZZ_SEEDS=1"
    ))
}

/// Target `hostfile`: the bytes as an MLX hostfile. An accepted hostfile lists at least one
/// rank, every rank at least one address that splits into host and port, and re-serialised as
/// JSON it parses to the same table; every address re-joined from its host and port splits to
/// the same pair.
pub fn hostfile(data: &[u8]) -> Verdict {
    let Ok(text) = std::str::from_utf8(data) else {
        return Ok(());
    };
    let Ok(table) = parse_hostfile("fuzz", text) else {
        return Ok(());
    };
    check(!table.is_empty(), || {
        "an empty hostfile was accepted".into()
    })?;
    for (rank, addresses) in table.iter().enumerate() {
        check(!addresses.is_empty(), || {
            format!("rank {rank} has no address")
        })?;
        for address in addresses {
            let (host, port) =
                split_host_port(address).map_err(|e| format!("accepted {address:?}: {e}"))?;
            let joined = if host.contains(':') || host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            let again = split_host_port(&joined).map_err(|e| format!("{joined:?}: {e}"))?;
            check(again == (host.clone(), port), || {
                format!("{address:?} splits to {host:?}:{port}, re-joined to {joined:?}")
            })?;
        }
    }
    let json = serde_json::to_string(&table).map_err(|e| e.to_string())?;
    let again = parse_hostfile("fuzz", &json).map_err(|e| format!("{json}: {e}"))?;
    check(again == table, || format!("{json} parses differently"))
}

/// Target `ifname`: the bytes as an `*_IFNAME` filter. An accepted filter prints as a spec
/// that parses to the same filter, and passes exactly the names it lists (or, as an exclusion
/// list, none of them).
pub fn ifname(data: &[u8]) -> Verdict {
    let Ok(spec) = std::str::from_utf8(data) else {
        return Ok(());
    };
    let Ok(filter) = IfnameFilter::parse(spec) else {
        return Ok(());
    };
    let printed = filter.to_string();
    let again = IfnameFilter::parse(&printed).map_err(|e| format!("{printed:?}: {e}"))?;
    check(again == filter, || {
        format!("{spec:?} prints as {printed:?}, which parses to {again:?}")
    })?;
    for name in filter.names() {
        check(filter.matches(name) != filter.is_exclusion(), || {
            format!("{spec:?} does not treat its own name {name:?} as listed")
        })?;
    }
    Ok(())
}

/// Target `launch_env`: the bytes as lines of `NAME=VALUE`, read as the process environment.
/// An accepted configuration has a rank inside a positive world size, a hostfile (when there
/// is one) of exactly that many ranks, a positive timeout and positive knobs. Hostfile values
/// that are not inline lists would name files, which are not this parser's input, so they are
/// left out.
pub fn launch_env(data: &[u8]) -> Verdict {
    let text = String::from_utf8_lossy(data);
    let vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, value)| !name.ends_with("HOSTFILE") || value.trim_start().starts_with('['))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let lookup = |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let Ok(env) = LaunchEnv::from_lookup(lookup) else {
        return Ok(());
    };
    check(env.world_size > 0 && env.rank < env.world_size, || {
        format!("rank {} of a world of {}", env.rank, env.world_size)
    })?;
    if let Rendezvous::Hostfile(entries) = &env.rendezvous {
        check(entries.len() == env.world_size as usize, || {
            format!(
                "a hostfile of {} ranks for a world of {}",
                entries.len(),
                env.world_size
            )
        })?;
    }
    check(!env.op_timeout.is_zero(), || "a zero timeout".into())?;
    check(env.sockets_per_peer != Some(0), || {
        "zero sockets per peer".into()
    })?;
    check(env.max_frame_bytes != Some(0), || "a zero frame cap".into())?;
    check(!env.job_id.is_empty(), || "an empty job id".into())
}

/// Target `symmetric_wire`: the bytes as a heap message. Whatever the decoder accepts encodes
/// back to exactly the same bytes (no two encodings of one message, no ignored bytes), and the
/// kind byte alone routes it the way the decoder reads it.
pub fn symmetric_wire(data: &[u8]) -> Verdict {
    let Ok(message) = wire::decode(1, data) else {
        return Ok(());
    };
    let encoded = wire::encode(&message);
    check(encoded == data, || {
        format!("{message:?} decoded from {data:02x?} encodes as {encoded:02x?}")
    })?;
    check(
        wire::is_request(data) == matches!(message, wire::Message::Request(_)),
        || format!("{message:?} is routed by its kind byte as the other direction"),
    )
}

/// Target `failure_notice`: the bytes as a failure notice. Only notices of exactly
/// [`FAILURE_WIRE_LEN`] bytes are accepted, an accepted notice encodes back to the same bytes,
/// and it turns into an error without panicking.
pub fn failure_notice(data: &[u8]) -> Verdict {
    let Ok(failure) = Failure::decode(3, data) else {
        return Ok(());
    };
    check(data.len() == FAILURE_WIRE_LEN, || {
        format!("a notice of {} bytes was accepted", data.len())
    })?;
    let encoded = failure.encode();
    check(encoded[..] == *data, || {
        format!("{failure:?} decoded from {data:02x?} encodes as {encoded:02x?}")
    })?;
    let _ = failure.into_error(3).to_string();
    Ok(())
}

/// Valid encodings from this crate's encoders and a few malformed inputs, for every target
/// above: the seed corpus under `fuzz/corpus/`.
pub fn seeds() -> Vec<Seed> {
    let mut c = Corpus::default();
    text_seeds(&mut c);
    symmetric_wire_seeds(&mut c);
    failure_notice_seeds(&mut c);
    c.into_seeds()
}

/// Seeds of the text parsers: hostfiles, interface filters, launch environments.
fn text_seeds(c: &mut Corpus) {
    c.add(
        "hostfile",
        "two-ranks",
        br#"[["10.0.0.1:5000"],["10.0.0.2:5000"]]"#.to_vec(),
    );
    c.add(
        "hostfile",
        "links-and-v6",
        br#"[["h0:1","h0:2"],"[fe80::1%eth0]:7",["[::1]:9"]]"#.to_vec(),
    );
    c.add("hostfile", "empty-list", b"[]".to_vec());
    c.add("hostfile", "no-port", br#"[["host"]]"#.to_vec());
    c.add("hostfile", "not-json", b"[[\"a:1\"".to_vec());
    c.add("ifname", "prefix", b"eth,en".to_vec());
    c.add("ifname", "exact", b"=eth1".to_vec());
    c.add("ifname", "exclude-exact", b"^=docker0, lo".to_vec());
    c.add("ifname", "separators-only", b" , ,".to_vec());
    c.add(
        "launch_env",
        "torchrun",
        b"RANK=1\nWORLD_SIZE=4\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=29500\n".to_vec(),
    );
    c.add(
        "launch_env",
        "rlx-everything",
        b"RLX_RANK=0\nRLX_HOSTFILE=[[\"a:1\"],[\"b:2\"]]\nRLX_SOCKET_IFNAME=^lo\n\
          RLX_TIMEOUT_MS=2500\nRLX_JOB_SECRET=s\nRLX_JOB_ID=j\nRLX_SOCKETS_PER_PEER=2\n\
          RLX_MAX_FRAME_BYTES=65536\n"
            .to_vec(),
    );
    c.add(
        "launch_env",
        "rank-outside",
        b"RLX_RANK=4\nRLX_WORLD_SIZE=4\nRLX_MASTER_ADDR=[::1]\nRLX_MASTER_PORT=1\n".to_vec(),
    );
    c.add(
        "launch_env",
        "zero-knobs",
        b"RLX_WORLD_SIZE=1\nRLX_MASTER_ADDR=h\nRLX_MASTER_PORT=1\nRLX_TIMEOUT_MS=0\n".to_vec(),
    );
}

/// Seeds of the one-sided wire: one of every request and response, and two broken ones.
fn symmetric_wire_seeds(c: &mut Corpus) {
    use crate::symmetric::HeapFault;
    use crate::symmetric::wire::{Message, Request, Response, Signal};

    let data: &[u8] = b"payload";
    let messages = [
        Message::Request(Request::Put {
            id: 1,
            offset: 64,
            data,
        }),
        Message::Request(Request::PutSignal {
            id: 2,
            offset: 8,
            signal: Signal::add(128, 1),
            data,
        }),
        Message::Request(Request::Get {
            id: 3,
            offset: 0,
            len: 4096,
        }),
        Message::Request(Request::FetchAdd {
            id: 4,
            offset: 16,
            value: 2,
        }),
        Message::Request(Request::CompareSwap {
            id: 5,
            offset: 24,
            expected: 1,
            new: 9,
        }),
        Message::Response(Response::Ack { id: 6 }),
        Message::Response(Response::Data { id: 7, data }),
        Message::Response(Response::Value { id: 8, value: 77 }),
        Message::Response(Response::Fault {
            id: 9,
            fault: HeapFault::OutOfBounds {
                offset: 1 << 40,
                len: 8,
                heap_size: 1 << 20,
            },
        }),
        Message::Response(Response::Fault {
            id: 10,
            fault: HeapFault::Misaligned { offset: 3 },
        }),
    ];
    for (i, message) in messages.iter().enumerate() {
        c.add(
            "symmetric_wire",
            &format!("valid-{i}"),
            wire::encode(message),
        );
    }
    c.add(
        "symmetric_wire",
        "truncated-get",
        wire::encode_get(1, 2, 3)[..20].to_vec(),
    );
    c.add("symmetric_wire", "unknown-kind", vec![0x42; 9]);
}

/// Seeds of the failure notices: one of each kind, an unknown cause, a short one.
fn failure_notice_seeds(c: &mut Corpus) {
    use crate::FatalCause;

    let notices = [
        Failure::LengthMismatch {
            expected: 4000,
            got: 4004,
            own: Some(16000),
        },
        Failure::Failed,
        Failure::GroupFailed {
            culprit: 2,
            cause: FatalCause::PeerLost,
        },
    ];
    for (i, notice) in notices.iter().enumerate() {
        c.add(
            "failure_notice",
            &format!("valid-{i}"),
            notice.encode().to_vec(),
        );
    }
    let mut unknown_cause = Failure::GroupFailed {
        culprit: 1,
        cause: FatalCause::PeerLost,
    }
    .encode();
    unknown_cause[9] = 0xee;
    c.add("failure_notice", "unknown-cause", unknown_cause.to_vec());
    c.add("failure_notice", "short", vec![1; FAILURE_WIRE_LEN - 1]);
}
