//! Every bootstrap path as real processes over loopback: an RLX hostfile, an MLX hostfile
//! with two links per peer, the rank-0 store under the `RLX_*`, torchrun, Open MPI, PMI and
//! Slurm conventions, a shared secret (right and wrong), and `RLX_SOCKET_IFNAME`.

mod common;

use std::time::Duration;

use common::{assert_all_ok, free_port, spawn, wait_all};

fn worker(role: &str) -> Result<(), String> {
    match role {
        "ring" => {
            let t = common::from_env()?;
            common::ring_check(&t)
        }
        other => Err(format!("unknown role {other}")),
    }
}

type Env = Vec<(String, String)>;

fn pairs(list: &[(&str, String)]) -> Env {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn run_ring(world: u32, env_of: impl Fn(u32) -> Env) -> Vec<common::Finished> {
    let children = (0..world).map(|r| spawn("ring", &env_of(r))).collect();
    wait_all(children, Duration::from_secs(90))
}

fn expect_ring_ok(world: u32, env_of: impl Fn(u32) -> Env) {
    let done = run_ring(world, env_of);
    assert_all_ok(&done);
    for (rank, f) in done.iter().enumerate() {
        assert!(
            f.stdout.contains(&format!("ok rank {rank} of {world}")),
            "{done:#?}"
        );
    }
}

fn write_hostfile(name: &str, json: &str) -> String {
    let path = std::env::temp_dir().join(format!("rlx-net-{}-{name}.json", std::process::id()));
    std::fs::write(&path, json).expect("write hostfile");
    path.to_string_lossy().into_owned()
}

fn rlx_hostfile() {
    let (json, _) = common::loopback_hostfile(4);
    let path = write_hostfile("rlx", &json);
    expect_ring_ok(4, |r| {
        pairs(&[("RLX_RANK", r.to_string()), ("RLX_HOSTFILE", path.clone())])
    });
}

fn mlx_hostfile_with_two_links() {
    let entries: Vec<String> = (0..3)
        .map(|_| {
            format!(
                "[\"127.0.0.1:{}\", \"127.0.0.1:{}\"]",
                free_port(),
                free_port()
            )
        })
        .collect();
    let path = write_hostfile("mlx", &format!("[{}]", entries.join(", ")));
    expect_ring_ok(3, |r| {
        pairs(&[("MLX_RANK", r.to_string()), ("MLX_HOSTFILE", path.clone())])
    });
}

fn store_env(
    rank_var: &str,
    size_var: &str,
    addr_var: &str,
    port_var: &str,
) -> impl Fn(u32) -> Env {
    let port = free_port();
    let (rank_var, size_var, addr_var, port_var) = (
        rank_var.to_owned(),
        size_var.to_owned(),
        addr_var.to_owned(),
        port_var.to_owned(),
    );
    move |r| {
        vec![
            (rank_var.clone(), r.to_string()),
            (size_var.clone(), "3".to_owned()),
            (addr_var.clone(), "127.0.0.1".to_owned()),
            (port_var.clone(), port.to_string()),
        ]
    }
}

fn rlx_store() {
    expect_ring_ok(
        3,
        store_env(
            "RLX_RANK",
            "RLX_WORLD_SIZE",
            "RLX_MASTER_ADDR",
            "RLX_MASTER_PORT",
        ),
    );
}

fn torchrun() {
    expect_ring_ok(
        3,
        store_env("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"),
    );
}

fn open_mpi() {
    expect_ring_ok(
        3,
        store_env(
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ),
    );
}

fn pmi() {
    expect_ring_ok(
        3,
        store_env("PMI_RANK", "PMI_SIZE", "RLX_MASTER_ADDR", "RLX_MASTER_PORT"),
    );
}

fn slurm() {
    expect_ring_ok(
        3,
        store_env("SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"),
    );
}

fn shared_secret() {
    let base = store_env("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT");
    expect_ring_ok(3, |r| {
        let mut env = base(r);
        env.push(("RLX_JOB_SECRET".into(), "correct horse".into()));
        env
    });
}

fn wrong_secret_is_refused() {
    let port = free_port();
    let done = run_ring(2, |r| {
        pairs(&[
            ("RLX_RANK", r.to_string()),
            ("RLX_WORLD_SIZE", "2".into()),
            ("RLX_MASTER_ADDR", "127.0.0.1".into()),
            ("RLX_MASTER_PORT", port.to_string()),
            ("RLX_TIMEOUT_MS", "4000".into()),
            (
                "RLX_JOB_SECRET",
                if r == 0 {
                    "right".into()
                } else {
                    "wrong".into()
                },
            ),
        ])
    });
    assert!(!done[1].ok, "{done:#?}");
    assert!(done[1].stdout.contains("RLX_JOB_SECRET"), "{done:#?}");
    assert!(
        done[0].stderr.contains("RLX_JOB_SECRET"),
        "rank 0 logs the refusal: {done:#?}"
    );
}

fn socket_ifname() {
    let base = store_env(
        "RLX_RANK",
        "RLX_WORLD_SIZE",
        "RLX_MASTER_ADDR",
        "RLX_MASTER_PORT",
    );
    expect_ring_ok(3, |r| {
        let mut env = base(r);
        env.push(("RLX_SOCKET_IFNAME".into(), "=lo".into()));
        env
    });
    let done = run_ring(1, |_| {
        pairs(&[
            ("RLX_RANK", "0".into()),
            ("RLX_WORLD_SIZE", "2".into()),
            ("RLX_MASTER_ADDR", "127.0.0.1".into()),
            ("RLX_MASTER_PORT", free_port().to_string()),
            ("RLX_SOCKET_IFNAME", "=nosuchif9".into()),
        ])
    });
    assert!(!done[0].ok);
    assert!(
        done[0].stdout.contains("matches no interface") && done[0].stdout.contains("lo"),
        "{done:#?}"
    );
}

fn bad_environment_is_a_config_error() {
    let done = run_ring(1, |_| {
        pairs(&[("RANK", "1".into()), ("WORLD_SIZE", "2".into())])
    });
    assert!(!done[0].ok);
    assert!(done[0].stdout.contains("no rendezvous"), "{done:#?}");
}

fn main() {
    common::run(
        &[
            ("rlx_hostfile", rlx_hostfile),
            ("mlx_hostfile_with_two_links", mlx_hostfile_with_two_links),
            ("rlx_store", rlx_store),
            ("torchrun", torchrun),
            ("open_mpi", open_mpi),
            ("pmi", pmi),
            ("slurm", slurm),
            ("shared_secret", shared_secret),
            ("wrong_secret_is_refused", wrong_secret_is_refused),
            ("socket_ifname", socket_ifname),
            (
                "bad_environment_is_a_config_error",
                bad_environment_is_a_config_error,
            ),
        ],
        worker,
    );
}
