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
const AMX: u8 = 1 << 5;

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
                        // The AMX variant falls back to AVX-512 VNNI for few rows.
                        f |= amx_bit(amx_cpuid(), request_tile_data);
                    }
                }
            }
        }
        f
    })
}

/// What CPUID and XCR0 say about AMX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AmxCpuid {
    /// CPUID.(EAX=7,ECX=0):EDX[24], AMX-TILE.
    tile: bool,
    /// CPUID.(EAX=7,ECX=0):EDX[25], AMX-INT8.
    int8: bool,
    /// XCR0 bits 17 and 18: the OS manages the tile configuration and data.
    os_state: bool,
}

/// The `AMX` bit: set only when the CPU has AMX-TILE and AMX-INT8, the OS manages the
/// tile state, and `grant` (asked last, once) obtains this process's permission to use
/// the tile data. A CPU without the instructions, or an OS that refuses, gives no bit.
fn amx_bit(cpu: AmxCpuid, grant: impl FnOnce() -> bool) -> u8 {
    if cpu.tile && cpu.int8 && cpu.os_state && grant() {
        AMX
    } else {
        0
    }
}

#[cfg(target_arch = "x86_64")]
fn amx_cpuid() -> AmxCpuid {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    // CPUID is in the x86-64 baseline; leaf 7 exists when leaf 0 reports it.
    let (max_leaf, osxsave) = (__cpuid(0).eax, __cpuid(1).ecx & (1 << 27) != 0);
    if max_leaf < 7 || !osxsave {
        return AmxCpuid {
            tile: false,
            int8: false,
            os_state: false,
        };
    }
    let edx = __cpuid_count(7, 0).edx;
    // SAFETY: OSXSAVE is set, so XGETBV is available and XCR0 readable.
    let xcr0 = unsafe { _xgetbv(0) };
    AmxCpuid {
        tile: edx & (1 << 24) != 0,
        int8: edx & (1 << 25) != 0,
        os_state: xcr0 & (0b11 << 17) == 0b11 << 17,
    }
}

/// Linux hands out the tile data (8 KiB of state per thread) only on request, once per
/// process, for all its threads: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// then `ARCH_GET_XCOMP_PERM` confirms it. A tile instruction before that faults.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these codes reads or writes only the u64 it is given.
    unsafe {
        if libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) != 0
        {
            return false;
        }
        let mut granted: u64 = 0;
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_GET_XCOMP_PERM,
            &mut granted as *mut u64,
        ) == 0
            && granted & (1 << XFEATURE_XTILEDATA) != 0
    }
}

/// Elsewhere there is no request to make and no way to know: no AMX.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
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
            AVX2_FMA | AVX512 | AVX512_VNNI | AMX,
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
    /// AMX-TILE and AMX-INT8 with the OS's permission to use the tile data, with AVX-512
    /// VNNI.
    pub fn amx(self) -> bool {
        self.features & AMX != 0 && self.avx512_vnni()
    }

    /// The extensions in the set, `+`-joined (`scalar` for none), for reports.
    pub fn name(self) -> String {
        let names = [
            (AVX2_FMA, "avx2"),
            (AVX_VNNI, "avxvnni"),
            (AVX512, "avx512"),
            (AVX512_VBMI, "vbmi"),
            (AVX512_VNNI, "vnni"),
            (AMX, "amx"),
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

    const ALL_AMX: AmxCpuid = AmxCpuid {
        tile: true,
        int8: true,
        os_state: true,
    };

    #[test]
    fn amx_needs_the_instructions_the_os_state_and_the_permission() {
        assert_eq!(amx_bit(ALL_AMX, || true), AMX);
        let refused = std::cell::Cell::new(0);
        assert_eq!(
            amx_bit(ALL_AMX, || {
                refused.set(refused.get() + 1);
                false
            }),
            0,
            "a refused permission must give no bit"
        );
        assert_eq!(refused.get(), 1);
        for cpu in [
            AmxCpuid {
                tile: false,
                ..ALL_AMX
            },
            AmxCpuid {
                int8: false,
                ..ALL_AMX
            },
            AmxCpuid {
                os_state: false,
                ..ALL_AMX
            },
        ] {
            // Without the instructions or the OS state, the permission is not even asked.
            assert_eq!(amx_bit(cpu, || panic!("asked for {cpu:?}")), 0, "{cpu:?}");
        }
    }

    #[test]
    fn amx_is_detected_where_the_cpu_lists_it() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let listed = cpuinfo.contains(" amx_int8") && cpuinfo.contains(" amx_tile");
        if !listed {
            assert!(
                !Isa::detect().amx(),
                "an AMX bit on a CPU that lists no AMX"
            );
            test_support::record_skip(
                "isa::tests::amx_is_detected_where_the_cpu_lists_it",
                "this CPU lists no amx_tile/amx_int8 in /proc/cpuinfo",
            );
            return;
        }
        // Linux grants the tile data to any process that asks (kernel 5.16 and later).
        assert!(
            Isa::detect().amx(),
            "/proc/cpuinfo lists AMX but detection set no bit: {}",
            Isa::detect().name()
        );
    }
}
