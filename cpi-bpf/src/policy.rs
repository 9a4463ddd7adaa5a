//! Perturbation options shared by collection and the PMU model, so both run the same
//! policy (cpi_common::policy) with the same defaults.

use clap::ValueEnum;
use cpi_common::policy::{Perturbation, DEFAULT_PERTURBATION, DEFAULT_THINNING};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerturbationArg {
    None,
    Kernel,
    User,
    Both,
}

impl From<PerturbationArg> for Perturbation {
    fn from(p: PerturbationArg) -> Self {
        match p {
            PerturbationArg::None => Perturbation::None,
            PerturbationArg::Kernel => Perturbation::Kernel,
            PerturbationArg::User => Perturbation::User,
            PerturbationArg::Both => Perturbation::Both,
        }
    }
}

impl From<Perturbation> for PerturbationArg {
    fn from(p: Perturbation) -> Self {
        match p {
            Perturbation::None => PerturbationArg::None,
            Perturbation::Kernel => PerturbationArg::Kernel,
            Perturbation::User => PerturbationArg::User,
            Perturbation::Both => PerturbationArg::Both,
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct PolicyArgs {
    /// Period perturbation layers: `user` re-draws each event's period (P + R, prime)
    /// after a random 48-112 of its own periods, which removes the bias of loops locked onto the period (measured with
    /// the PMU model); `kernel` thins records in the BPF program (fewer records, exact
    /// totals, same phase); `both`; `none`.
    #[arg(long, visible_alias = "perturb", value_enum,
          default_value_t = PerturbationArg::from(DEFAULT_PERTURBATION))]
    pub perturbation: PerturbationArg,
    /// Kernel-layer thinning: one record per K overflows on average (with
    /// `--perturbation kernel|both`).
    #[arg(long, visible_alias = "thin", value_name = "K", default_value_t = DEFAULT_THINNING)]
    pub thinning: u32,
}

impl PolicyArgs {
    pub fn perturbation(&self) -> Perturbation {
        self.perturbation.into()
    }
}
