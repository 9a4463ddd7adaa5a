//! What a core PMU's raw event codes count, per CPU vendor: the one table the collector
//! opens events from (`collect/events.rs`) and import reads recordings with
//! (`import/mod.rs`): `-e rc4` counts taken branches on AMD and all branches on Intel.

/// CPU vendor, for the raw retired-taken-branches event code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// `GenuineIntel`: `BR_INST_RETIRED.NEAR_TAKEN`.
    Intel,
    /// `AuthenticAMD`: `ex_ret_brn_tkn`.
    Amd,
    /// Anything else: no raw branch event is known, the generic one is tried.
    Other,
}

impl Vendor {
    /// From `/proc/cpuinfo`'s `vendor_id`, or the first field of a perf.data header's
    /// cpuid (`GenuineIntel,6,85,4`).
    pub(crate) fn from_vendor_id(id: &str) -> Vendor {
        match id.split(',').next().unwrap_or("").trim() {
            "GenuineIntel" => Vendor::Intel,
            "AuthenticAMD" | "HygonGenuine" => Vendor::Amd,
            _ => Vendor::Other,
        }
    }
}

/// Intel `BR_INST_RETIRED.NEAR_TAKEN` (umask 0x20, event 0xc4).
pub(crate) const INTEL_RETIRED_TAKEN: u64 = 0x20c4;
/// The same on hybrid parts' E-cores (`cpu_atom`, `cpu_lowpower`: umask 0xc0).
pub(crate) const INTEL_ATOM_RETIRED_TAKEN: u64 = 0xc0c4;
/// The raw retired-taken-branches code for `vendor`'s core PMU `pmu` (`None`: the one
/// core PMU): P-cores (`cpu`, `cpu_core`) 0x20c4; E-cores (`cpu_atom`, Arrow Lake-H's
/// low-power `cpu_lowpower`) 0xc0c4 (perf's pmu-events x86/alderlaken and
/// x86/arrowlake/pipeline.json); AMD `ex_ret_brn_tkn`, also the one event Zen 3's BRS
/// samples on (the kernel's arch/x86/events/amd/brs.c). `None`: no such event known.
pub(crate) fn retired_taken(vendor: Vendor, pmu: Option<&str>) -> Option<u64> {
    match (vendor, pmu) {
        (Vendor::Intel, None | Some("cpu" | "cpu_core")) => Some(INTEL_RETIRED_TAKEN),
        (Vendor::Intel, Some("cpu_atom" | "cpu_lowpower")) => Some(INTEL_ATOM_RETIRED_TAKEN),
        (Vendor::Amd, None | Some("cpu")) => Some(AMD_RETIRED_TAKEN),
        _ => None,
    }
}

/// Intel `CPU_CLK_UNHALTED.THREAD` (architectural event 0x3c).
const INTEL_CYCLES: u64 = 0x3c;
/// AMD `ex_ret_brn_tkn` (PMCx0C4, retired taken branch instructions).
pub(crate) const AMD_RETIRED_TAKEN: u64 = 0xc4;
/// AMD `ls_not_halted_cyc` (PMCx076, core cycles not halted).
const AMD_CYCLES: u64 = 0x76;

/// What a raw core-PMU event counts, when it is one the analysis has a use for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawEvent {
    /// Retired taken branches.
    TakenBranches,
    /// Core cycles.
    Cycles,
}

/// What raw `config` counts on `vendor`'s cores (`None`: the vendor is not known, e.g.
/// a recording without a cpuid header). Only the event select and unit mask decide (the
/// other bits are modifiers: edge, inv, cmask, ...). Without a vendor, Intel's codes
/// whose unit mask no AMD event uses are still recognised; `rc4` is not (it is all
/// branches on Intel).
pub(crate) fn raw_event(vendor: Option<Vendor>, config: u64) -> Option<RawEvent> {
    let intel = match config & 0xffff {
        INTEL_RETIRED_TAKEN | INTEL_ATOM_RETIRED_TAKEN => Some(RawEvent::TakenBranches),
        INTEL_CYCLES => Some(RawEvent::Cycles),
        _ => None,
    };
    // AMD's event select is 12 bits, config[7:0] and config[35:32]; config[15:8] is
    // the unit mask.
    let amd = match (config & 0xffff) | ((config >> 32) & 0xf) << 16 {
        AMD_RETIRED_TAKEN => Some(RawEvent::TakenBranches),
        AMD_CYCLES => Some(RawEvent::Cycles),
        _ => None,
    };
    match vendor {
        Some(Vendor::Intel) => intel,
        Some(Vendor::Amd) => amd,
        Some(Vendor::Other) => None,
        None => intel.filter(|_| config & 0xff00 != 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_codes_mean_what_the_vendor_says() {
        use RawEvent::*;
        let (i, a) = (Some(Vendor::Intel), Some(Vendor::Amd));
        // perf record -e r20c4 (Intel P-cores), rc0c4 (E-cores), rc4 (AMD).
        assert_eq!(raw_event(i, 0x20c4), Some(TakenBranches));
        assert_eq!(raw_event(i, 0xc0c4), Some(TakenBranches));
        assert_eq!(raw_event(a, 0xc4), Some(TakenBranches));
        // rc4 on Intel is BR_INST_RETIRED.ALL_BRANCHES; r20c4 is nothing on AMD.
        assert_eq!(raw_event(i, 0xc4), None);
        assert_eq!(raw_event(a, 0x20c4), None);
        assert_eq!(raw_event(i, 0x3c), Some(Cycles));
        assert_eq!(raw_event(a, 0x76), Some(Cycles));
        // AMD's extended event select: PMCx1C4 is not PMCx0C4.
        assert_eq!(raw_event(a, 0x1_0000_00c4), None);
        // Modifier bits (cmask in 31:24, edge) do not change the event.
        assert_eq!(raw_event(i, 0x0100_20c4), Some(TakenBranches));
        // No cpuid: only codes that cannot be AMD's.
        assert_eq!(raw_event(None, 0x20c4), Some(TakenBranches));
        assert_eq!(raw_event(None, 0xc4), None);
        assert_eq!(raw_event(Some(Vendor::Other), 0x20c4), None);
        assert_eq!(Vendor::from_vendor_id("GenuineIntel,6,85,4"), Vendor::Intel);
        assert_eq!(Vendor::from_vendor_id("AuthenticAMD"), Vendor::Amd);
        assert_eq!(Vendor::from_vendor_id("HygonGenuine,24,0,1"), Vendor::Amd);
        assert_eq!(Vendor::from_vendor_id("0x00000000410fd0c0"), Vendor::Other);
    }
}
