//! The examples' workloads, run at small sizes on in-process worlds of 1 to 4 ranks and
//! checked the way their own summaries judge them (CI also runs the example binaries as
//! separate processes through `cargo xtask launch`).

mod common;

#[allow(dead_code, reason = "the example's main is for its binary")]
#[path = "../examples/data_parallel.rs"]
mod data_parallel;

#[test]
fn data_parallel_training_matches_one_process_with_identical_weights() {
    let cfg = data_parallel::Config {
        steps: 60,
        ..data_parallel::Config::default()
    };
    for world in 1..=4 {
        let reports = common::on_each(common::world(world), move |group| {
            data_parallel::train(&group, &cfg)
        });
        for (rank, report) in reports.into_iter().enumerate() {
            let report = report.unwrap();
            assert!(report.identical, "world {world}: rank {rank} diverged");
            assert!(
                report.final_loss < report.first_loss / 4.0,
                "world {world}: {report:?}"
            );
            if rank == 0 {
                let drift = (report.final_loss - report.reference_loss).abs();
                assert!(
                    drift <= 1e-4 * report.reference_loss,
                    "world {world}: {report:?}"
                );
            }
        }
    }
}

#[test]
fn compressed_data_parallel_training_reaches_the_uncompressed_loss() {
    use rlx_collective::Compression;

    for compression in [Compression::Bf16, Compression::Fp16, Compression::Int8] {
        let cfg = data_parallel::Config {
            steps: 200,
            compression: Some(compression),
            ..data_parallel::Config::default()
        };
        for world in [2, 4] {
            let reports = common::on_each(common::world(world), move |group| {
                data_parallel::train(&group, &cfg)
            });
            let report = reports.into_iter().next().unwrap().unwrap();
            assert!(
                report.identical,
                "{compression}, world {world}: ranks diverged"
            );
            let drift = (report.final_loss - report.reference_loss).abs() / report.reference_loss;
            assert!(
                drift <= data_parallel::tolerance(cfg.compression),
                "{compression}, world {world}: relative drift {drift:.2e}: {report:?}"
            );
            eprintln!("{compression}, world {world}: relative drift {drift:.2e}: {report:?}");
        }
    }
}

#[allow(dead_code, reason = "the example's main is for its binary")]
#[path = "../examples/pipeline_parallel.rs"]
mod pipeline_parallel;

#[test]
fn pipelined_stages_give_the_unsplit_models_outputs() {
    let cfg = pipeline_parallel::Config::default();
    for world in 1..=4 {
        let reports = common::on_each(common::world(world), move |group| {
            pipeline_parallel::run(&group, &cfg)
        });
        let last = reports.into_iter().last().unwrap().unwrap();
        assert_eq!(last.checked, cfg.micro_batches, "world {world}");
        assert_eq!(last.matching, cfg.micro_batches, "world {world}");
    }
}

#[allow(dead_code, reason = "the example's main is for its binary")]
#[path = "../examples/tensor_parallel.rs"]
mod tensor_parallel;

#[test]
fn split_matrix_multiplies_sum_to_the_unsplit_block() {
    let cfg = tensor_parallel::Config {
        tokens: 4,
        model: 16,
        hidden: 37,
        steps: 2,
    };
    for world in 1..=4 {
        let reports = common::on_each(common::world(world), move |group| {
            tensor_parallel::run(&group, &cfg)
        });
        for (rank, report) in reports.into_iter().enumerate() {
            let report = report.unwrap();
            assert!(
                report.max_error <= 1e-4,
                "world {world} rank {rank}: {report:?}"
            );
        }
    }
}

#[allow(dead_code, reason = "the example's main is for its binary")]
#[path = "../examples/federated.rs"]
mod federated;

/// Convergence and the participant counts; whether the slow client makes a given deadline
/// depends on the machine's scheduling, so only the bounds are checked here (the late
/// contribution's fate is checked by event in `tests/federated.rs`).
#[test]
fn federated_rounds_converge_with_a_slow_client() {
    let cfg = federated::Config {
        rounds: 6,
        deadline: std::time::Duration::from_millis(50),
        slow_by: std::time::Duration::from_millis(150),
        local_steps: 10,
    };
    for world in [1u32, 3] {
        let reports = common::on_each(common::world(world), move |group| {
            federated::run(&group, &cfg)
        });
        for (rank, report) in reports.into_iter().enumerate() {
            let report = report.unwrap();
            assert!(
                report.final_error < report.first_error / 10.0,
                "world {world} rank {rank}: {report:?}"
            );
            if rank == 0 {
                assert_eq!(report.participants.len(), cfg.rounds);
                assert!(
                    report
                        .participants
                        .iter()
                        .all(|&n| (1..=world as usize).contains(&n))
                );
            }
        }
    }
}
