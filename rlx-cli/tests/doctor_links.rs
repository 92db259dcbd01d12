//! The doctor against links with known faults: two network namespaces joined by a veth named
//! `thunderbolt0` and another named `wlan0`, the ranks being the `rlx` binary itself.

use rlx_cli::doctor::{advise, collect, render};
use rlx_cli::job::ChildSpec;

/// Two namespaces joined by a veth named `thunderbolt0` and another named `wlan0`, with
/// the rendezvous on the wlan0 side: the doctor measures the pair and flags it.
#[test]
fn the_doctor_flags_a_pair_that_goes_over_wlan0() {
    if !rlx_cli::netns::available_for_test("the_doctor_flags_a_pair_that_goes_over_wlan0") {
        return;
    }
    let net = TwoHosts::create();
    let reports = collect(&net.doctor_ranks("10.79.2.1", 29555)).unwrap();
    let advice = advise(&reports);
    let text = render(&reports, &advice);
    assert!(text.contains("goes over wlan0"), "{text}");
    assert!(text.contains("RLX_TB_IFNAME=thunderbolt0"), "{text}");
    assert_eq!(reports[0].thunderbolt_links, ["thunderbolt0"], "{text}");
    assert!(reports[0].peers[0].rtt_median_us.is_some(), "{text}");
}

/// The same two namespaces, the rendezvous on the `thunderbolt0` side, and an nftables
/// rule in rank 1's namespace that drops every 20th TCP packet with a payload arriving from
/// rank 0: the drops are counted, not left to whether a queue overflows, so rank 0 sends
/// segments again in every run however the machine is loaded. (A drop on rank 0's own
/// output would not do: TCP sees the local error and simply sends the segment later, which
/// it does not count as a retransmission.) The doctor counts them and says what to look at.
#[test]
fn the_doctor_flags_a_link_that_drops_packets() {
    if !rlx_cli::netns::available_for_test("the_doctor_flags_a_link_that_drops_packets")
        || !nftables_available("the_doctor_flags_a_link_that_drops_packets")
    {
        return;
    }
    let net = TwoHosts::create();
    let nft = |rule: &str| {
        let status = std::process::Command::new("ip")
            .args(["netns", "exec", &net.names[1], "nft", rule])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "nft {rule}");
    };
    nft("add table inet rlx_loss");
    nft("add chain inet rlx_loss in { type filter hook input priority 0; }");
    nft(
        "add rule inet rlx_loss in ip saddr 10.79.1.1 meta l4proto tcp meta length > 1000 \
         numgen inc mod 20 0 counter drop",
    );
    let reports = collect(&net.doctor_ranks("10.79.1.1", 29556)).unwrap();
    let advice = advise(&reports);
    let text = render(&reports, &advice);
    let segments = reports[0].peers[0].segments.expect("Linux counts segments");
    let rules = std::process::Command::new("ip")
        .args(["netns", "exec", &net.names[1], "nft", "list", "ruleset"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(segments.lossy(), "{segments:?}\n{text}\n{rules}");
    assert!(
        text.contains("rank 0 ↔ 1: rank 0 sent") && text.contains("ip -s link"),
        "{text}"
    );
    assert!(!text.contains("wlan0"), "{text}");
}

/// Whether nftables' `nft` is here to drop packets by count. When it is not, the test says
/// why and returns early; under `CI=true`, whose `.ci/run` installs it, it fails instead.
fn nftables_available(test: &str) -> bool {
    let found = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !rlx_cli::in_ci(),
            "CI=true, yet {test} cannot run: nftables' `nft` is missing"
        );
        eprintln!("{test} skipped: nftables' `nft` is missing (apt-get install nftables)");
    }
    found
}

/// Two namespaces with two veth pairs between them, removed on drop.
struct TwoHosts {
    names: [String; 2],
}

impl TwoHosts {
    fn create() -> Self {
        // Tests of one process run side by side: each pair of namespaces is numbered.
        static CREATED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let number = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = std::process::id();
        let names = [
            format!("rlxdoc-a-{tag}-{number}"),
            format!("rlxdoc-b-{tag}-{number}"),
        ];
        let ip = |args: &[&str]| {
            let status = std::process::Command::new("ip").args(args).status();
            assert!(status.is_ok_and(|s| s.success()), "ip {}", args.join(" "));
        };
        let hosts = TwoHosts { names };
        let [a, b] = &hosts.names;
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        for (link, subnet) in [("thunderbolt0", 1), ("wlan0", 2)] {
            let peer = format!("{link}p{tag}");
            let short: String = peer.chars().take(15).collect();
            ip(&[
                "link", "add", link, "netns", a, "type", "veth", "peer", "name", &short, "netns", b,
            ]);
            ip(&["-n", b, "link", "set", &short, "name", link]);
            for (ns, host) in [(a, 1), (b, 2)] {
                let addr = format!("10.79.{subnet}.{host}/24");
                ip(&["-n", ns, "addr", "add", &addr, "dev", link]);
                ip(&["-n", ns, "link", "set", link, "up"]);
            }
        }
        for ns in [a, b] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        hosts
    }
}

impl TwoHosts {
    /// The doctor's two ranks, one in each namespace, meeting at `master`.
    fn doctor_ranks(&self, master: &str, port: u16) -> Vec<ChildSpec> {
        let binary = env!("CARGO_BIN_EXE_rlx");
        (0..2u32)
            .map(|rank| {
                let mut spec = ChildSpec::new(format!("rank {rank}"), binary)
                    .args(["__doctor-rank"])
                    .env("RLX_RANK", rank.to_string())
                    .env("RLX_WORLD_SIZE", "2")
                    .env("RLX_MASTER_ADDR", master)
                    .env("RLX_MASTER_PORT", port.to_string())
                    .env("RLX_TIMEOUT_MS", "60000");
                spec.netns = Some(self.names[rank as usize].clone());
                spec
            })
            .collect()
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}
