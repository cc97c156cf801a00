//! `simulate`: runs seeds of the deterministic simulation and reports what they broke.
//!
//! ```text
//! simulate --seeds N [--first S] [--faults a,b,…] [--mutant NAME]   N seeds from S (default 0)
//! simulate --seed S [--faults …] [--mutant NAME] [--history]        one seed, its history
//! simulate … --determinism     each seed run twice: its two histories must be the same bytes
//! simulate --model-check       the engine model-checked (stateright), reject and reexecute
//! simulate --list-mutants | --list-faults
//! ```

use std::process::ExitCode;
use std::time::Instant;

use mcp_idem_simulator::faults::FaultKind;
use mcp_idem_simulator::invariants::Exceptions;
use mcp_idem_simulator::{run_seed, Options};
use mcp_idempotency::simulation::Mutant;

struct Args {
    seeds: u64,
    first: u64,
    one: Option<u64>,
    history: bool,
    determinism: bool,
    options: Options,
}

fn parse() -> Result<Option<Args>, String> {
    let mut args = Args {
        seeds: 1,
        first: 0,
        one: None,
        history: false,
        determinism: false,
        options: Options::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seeds" => args.seeds = number(&value("--seeds")?)?,
            "--first" => args.first = number(&value("--first")?)?,
            "--seed" => args.one = Some(number(&value("--seed")?)?),
            "--history" => args.history = true,
            "--determinism" => args.determinism = true,
            "--model-check" => {
                model_check()?;
                return Ok(None);
            }
            "--faults" => {
                args.options.faults = value("--faults")?
                    .split(',')
                    .filter(|name| !name.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--mutant" => args.options.mutant = Some(value("--mutant")?.parse()?),
            "--list-mutants" => {
                for mutant in Mutant::ALL {
                    println!("{:<26} {}", mutant.name(), mutant.description());
                }
                return Ok(None);
            }
            "--list-faults" => {
                for kind in FaultKind::ALL {
                    let default = FaultKind::default_set().contains(kind);
                    println!("{}{}", kind.name(), if default { "" } else { " (opt-in)" });
                }
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

/// Checks the engine's model under both after-crash policies; an error if a property fails.
fn model_check() -> Result<(), String> {
    use mcp_idem_simulator::model_check::{check, Config};
    use mcp_idempotency::AfterCrash;
    let reexecute = Config {
        after_crash: AfterCrash::Reexecute,
        ..Config::default()
    };
    for config in [Config::default(), reexecute] {
        let report = check(config).map_err(|err| err.to_string())?;
        println!("{report}");
        if !report.holds() {
            return Err("a property of the model does not hold".to_owned());
        }
    }
    Ok(())
}

fn number(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("simulate: {err}");
            return ExitCode::from(2);
        }
    };
    let seeds = match args.one {
        Some(seed) => seed..seed + 1,
        None => args.first..args.first + args.seeds,
    };
    let count = seeds.end - seeds.start;
    let started = Instant::now();
    let (mut violations, mut calls, mut executions, mut faults) = (0, 0, 0, 0);
    let mut exceptions = Exceptions::default();
    for seed in seeds {
        let mut report = run_seed(seed, &args.options);
        if args.determinism {
            let again = run_seed(seed, &args.options);
            if again.history != report.history {
                report
                    .violations
                    .push(mcp_idem_simulator::invariants::Violation {
                        invariant: "determinism",
                        detail: format!(
                            "two runs of seed {seed} gave different histories ({} and {} lines)",
                            report.history.lines().count(),
                            again.history.lines().count()
                        ),
                    });
            }
        }
        calls += report.calls;
        executions += report.executions;
        faults += report.faults;
        exceptions.add(&report.exceptions);
        if args.history {
            print!("{}", report.history);
        }
        if !report.violations.is_empty() {
            violations += report.violations.len();
            if !args.history {
                print!("{}", report.history);
            }
            println!("seed {seed} broke:");
            for violation in &report.violations {
                println!("  {violation}");
            }
            println!("replay it: {}", replay_command(seed, &args.options));
        }
    }
    println!(
        "{count} seeds, {violations} violations ({calls} calls, {executions} executions, {faults} faults, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!("documented exceptions counted: {exceptions:?}");
    if violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn replay_command(seed: u64, options: &Options) -> String {
    let mut command = format!("scripts/simulate.sh --seed {seed}");
    if options.faults != FaultKind::default_set() {
        let names: Vec<_> = options.faults.iter().map(|kind| kind.name()).collect();
        command.push_str(&format!(" --faults {}", names.join(",")));
    }
    if let Some(mutant) = options.mutant {
        command.push_str(&format!(" --mutant {mutant}"));
    }
    command
}
