//! The instruction-set token: which vector extensions a kernel may use.
//!
//! An [`Isa`] can only be obtained from [`Isa::detect`], [`Isa::available`] (both built
//! from run-time CPU detection) or [`Isa::scalar`] (no extension at all). Its fields are
//! private, so safe code cannot forge a token naming an extension the CPU lacks, and every
//! `unsafe` call into a `#[target_feature]` function is justified by a flag that detection
//! set. Detection runs once per process.

use std::sync::OnceLock;

/// CPU features the kernels use, as bits of [`Isa`]'s set.
const AVX2_FMA: u8 = 1 << 0;
const AVX_VNNI: u8 = 1 << 1;
const AVX512: u8 = 1 << 2;
const AVX512_VBMI: u8 = 1 << 3;
const AVX512_VNNI: u8 = 1 << 4;

/// A set of CPU extensions that run-time detection found on this CPU (or a subset of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    features: u8,
}

fn detected() -> u8 {
    static DETECTED: OnceLock<u8> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[allow(unused_mut)]
        let mut f = 0u8;
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                f |= AVX2_FMA;
                if has!("avxvnni") {
                    f |= AVX_VNNI;
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                    f |= AVX512;
                    if has!("avx512vbmi") {
                        f |= AVX512_VBMI;
                    }
                    if has!("avx512vnni") {
                        f |= AVX512_VNNI;
                    }
                }
            }
        }
        f
    })
}

impl Isa {
    /// Portable code only: the definition of every family's arithmetic.
    pub fn scalar() -> Isa {
        Isa { features: 0 }
    }

    /// Everything this CPU offers that the kernels use (detected once per process).
    pub fn detect() -> Isa {
        Isa {
            features: detected(),
        }
    }

    /// One token per kernel variant this CPU can run, scalar first, then growing subsets
    /// of the detected extensions, so that every variant of every family is the best
    /// choice of at least one token (tests compare them all against the reference).
    pub fn available() -> Vec<Isa> {
        let all = detected();
        let ladder = [
            0,
            AVX2_FMA,
            AVX2_FMA | AVX_VNNI,
            AVX2_FMA | AVX512,
            AVX2_FMA | AVX512 | AVX512_VBMI,
            AVX2_FMA | AVX512 | AVX512_VNNI,
            all,
        ];
        let mut out: Vec<Isa> = Vec::new();
        for features in ladder {
            if features & all == features && !out.iter().any(|i| i.features == features) {
                out.push(Isa { features });
            }
        }
        out
    }

    /// The token without the extensions that `other` lacks (never adds any).
    pub fn limited_to(self, other: Isa) -> Isa {
        Isa {
            features: self.features & other.features,
        }
    }

    /// AVX2 and FMA.
    pub fn avx2(self) -> bool {
        self.features & AVX2_FMA != 0
    }
    /// AVX-VNNI (256-bit `vpdpbusd`), with AVX2.
    pub fn avx_vnni(self) -> bool {
        self.features & AVX_VNNI != 0
    }
    /// AVX-512 F, BW and VL, with AVX2.
    pub fn avx512(self) -> bool {
        self.features & AVX512 != 0
    }
    /// AVX-512 VBMI, with AVX-512.
    pub fn avx512_vbmi(self) -> bool {
        self.features & AVX512_VBMI != 0
    }
    /// AVX-512 VNNI, with AVX-512.
    pub fn avx512_vnni(self) -> bool {
        self.features & AVX512_VNNI != 0
    }

    /// The extensions in the set, `+`-joined (`scalar` for none), for reports.
    pub fn name(self) -> String {
        let names = [
            (AVX2_FMA, "avx2"),
            (AVX_VNNI, "avxvnni"),
            (AVX512, "avx512"),
            (AVX512_VBMI, "vbmi"),
            (AVX512_VNNI, "vnni"),
        ];
        let parts: Vec<&str> = names
            .iter()
            .filter(|(bit, _)| self.features & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        if parts.is_empty() {
            "scalar".to_string()
        } else {
            parts.join("+")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_exceed_detection() {
        let all = Isa::detect();
        for isa in Isa::available() {
            assert_eq!(isa.limited_to(all), isa, "{}", isa.name());
        }
        assert_eq!(Isa::available()[0], Isa::scalar());
        assert_eq!(*Isa::available().last().unwrap(), all);
        assert_eq!(Isa::scalar().name(), "scalar");
    }
}
