//! Helpers shared by the mtp integration tests.
#![allow(dead_code)]

/// Two-sample chi-squared statistic over the cells either sample hit, and its degrees
/// of freedom (cells - 1).
pub fn chi2(a: &[f64], b: &[f64]) -> (f64, usize) {
    let (na, nb): (f64, f64) = (a.iter().sum(), b.iter().sum());
    let mut stat = 0.0;
    let mut cells = 0;
    for (&x, &y) in a.iter().zip(b) {
        if x + y == 0.0 {
            continue;
        }
        cells += 1;
        let ka = (nb / na).sqrt();
        let kb = (na / nb).sqrt();
        stat += (ka * x - kb * y).powi(2) / (x + y);
    }
    (stat, cells - 1)
}
