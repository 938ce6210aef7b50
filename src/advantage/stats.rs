//! Group normalisation, the one statistic every advantage mode is built from.

/// Added to the standard deviation before dividing, as in the reference GRPO, so
/// that a group whose rewards are all equal gets advantage 0 instead of NaN.
pub const STD_EPS: f64 = 1e-6;

/// `(x - mean) / (std + STD_EPS)` for every value of one group.
///
/// `std` is the unbiased (n − 1) standard deviation. A group of one value has
/// mean 0 and std 1 by convention (the reference GRPO does the same, since the
/// unbiased std of one sample is undefined), so a lone value `x` maps to
/// `x / (1 + STD_EPS)`. An empty group gives an empty vector.
pub fn group_normalize(values: &[f64]) -> Vec<f64> {
    let (mean, std) = mean_std(values);
    values
        .iter()
        .map(|x| (x - mean) / (std + STD_EPS))
        .collect()
}

/// Mean and unbiased std, with the group-of-one convention of [`group_normalize`].
fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n <= 1 {
        return (0.0, 1.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let sq: f64 = values.iter().map(|x| (x - mean) * (x - mean)).sum();
    (mean, (sq / (n - 1) as f64).sqrt())
}

/// Plain arithmetic mean (no group-of-one convention); 0 for an empty slice.
/// Used for step values, which are averages of rewards, not normalisations.
pub(super) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}
