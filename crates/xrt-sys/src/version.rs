//! XRT version discovery, shared by `build.rs` (which includes this file) and the
//! `onebit doctor` report. Pure text parsing: no XRT needed to test it.

/// The first XRT whose C++ API has `xrt::device::register_xclbin` and
/// `xrt::hw_context` working on the Ryzen AI (amdxdna) driver.
pub const MINIMUM_XRT: (u32, u32) = (2, 17);

/// Parses `major.minor[.patch[...]]`, ignoring anything after the numbers
/// (`2.19.0-rc1` → `(2, 19, 0)`).
pub fn parse_dotted(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().split('.');
    let number = |part: Option<&str>| -> Option<u32> {
        let digits: String = part?.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    };
    let major = number(parts.next())?;
    let minor = number(parts.next())?;
    let patch = number(parts.next()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Reads the version from an installed XRT's `include/version.h`
/// (`static const char xrt_build_version[] = "2.18.0";`).
pub fn parse_version_header(text: &str) -> Option<(u32, u32, u32)> {
    let line = text
        .lines()
        .find(|line| line.contains("xrt_build_version[]"))?;
    let quoted = line.split('"').nth(1)?;
    parse_dotted(quoted)
}

/// Reads the version from an installed XRT's `version.json`
/// (`"BUILD_VERSION" : "2.17.319"`), without a JSON parser in the build script.
pub fn parse_version_json(text: &str) -> Option<(u32, u32, u32)> {
    let at = text.find("\"BUILD_VERSION\"")?;
    let rest = &text[at + "\"BUILD_VERSION\"".len()..];
    let value = rest.split('"').nth(1)?;
    parse_dotted(value)
}

/// Whether this XRT can register an xclbin and open a hardware context.
pub fn supports_register_xclbin(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= MINIMUM_XRT
}
