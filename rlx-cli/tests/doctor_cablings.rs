//! The doctor on an emulated cabling, end to end: `rlx doctor --netns --topology
//! chain:0-2-1-3` run as a user would, with a mesh declared (`RLX_CABLING=mesh`). Every pair
//! that a cable joins must be reached over that cable (its peer address the far end of the
//! cable, its interface the cable's), every cable of the declared mesh that the chain lacks
//! must be named by its two ranks, and the picture must draw them.

use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn the_doctor_reaches_each_peer_over_its_cable_and_names_the_missing_ones() {
    let test = "the_doctor_reaches_each_peer_over_its_cable_and_names_the_missing_ones";
    if !rlx_cli::netns::available_for_test(test) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rlx-doctor-cablings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let (json, svg) = (dir.join("report.json"), dir.join("cluster.svg"));
    let output = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args([
            "doctor",
            "--ranks",
            "4",
            "--netns",
            "--topology",
            "chain:0-2-1-3",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .env("RLX_CABLING", "mesh")
        .output()
        .expect("rlx doctor runs");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
            .expect("JSON");
    let mut cabled = BTreeSet::new();
    for rank in report["ranks"].as_array().expect("the ranks' reports") {
        let me = rank["rank"].as_u64().expect("a rank");
        for peer in rank["peers"].as_array().expect("its peers") {
            let link = peer["link"].as_str().unwrap_or("-");
            let Some(cable) = link.strip_prefix("cable ") else {
                continue;
            };
            let other = peer["peer"].as_u64().expect("a peer");
            cabled.insert((me.min(other), me.max(other)));
            assert_eq!(
                peer["interface"].as_str(),
                Some(cable),
                "rank {me} reaches rank {other} over its cable {cable}:\n{printed}"
            );
            let addr = peer["addr"].as_str().unwrap_or("-");
            assert!(
                addr.starts_with("10.214."),
                "rank {me} knows rank {other} at {addr}, not at its cable's end:\n{printed}"
            );
        }
    }
    assert_eq!(
        cabled,
        BTreeSet::from([(0, 2), (1, 2), (1, 3)]),
        "{printed}"
    );
    let advice: Vec<&str> = report["advice"]
        .as_array()
        .expect("the advice")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for pair in ["ranks 0 and 1", "ranks 0 and 3", "ranks 2 and 3"] {
        assert!(
            advice
                .iter()
                .any(|a| a.contains(&format!("no cable joins {pair}"))),
            "{pair}: {advice:?}"
        );
    }
    let picture = std::fs::read_to_string(&svg).expect("the picture");
    assert_eq!(picture.matches(">missing cable<").count(), 3, "{picture}");
    assert!(
        picture.contains("rings visit the ranks as 0-2-1-3"),
        "{picture}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
