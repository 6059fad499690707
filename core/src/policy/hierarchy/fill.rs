//! Sharing an amount in proportion to weights, each share capped.

/// Adds to `given` shares of `amount` in proportion to `weights`, none
/// growing by more than its `room`; what one cannot take goes to the
/// others, still in proportion. Items of no weight or no room get
/// nothing. Returns what is left: more than zero only when every item
/// that could take some is full.
///
/// `order` is scratch space, kept by the caller between calls.
pub(super) fn fill(
    amount: f64,
    weights: &[f64],
    room: &[f64],
    given: &mut [f64],
    order: &mut Vec<usize>,
) -> f64 {
    order.clear();
    order.extend((0..weights.len()).filter(|&i| weights[i] > 0.0 && room[i] > 0.0));
    // Items fill up in the order of room per weight: once the smallest
    // is full at the common level, the level rises for the rest.
    order.sort_unstable_by(|&a, &b| (room[a] / weights[a]).total_cmp(&(room[b] / weights[b])));
    let mut left = amount.max(0.0);
    let mut weight: f64 = order.iter().map(|&i| weights[i]).sum();
    for &i in order.iter() {
        if weight <= 0.0 || left <= 0.0 {
            break;
        }
        let share = (left * weights[i] / weight).min(room[i]);
        given[i] += share;
        left -= share;
        weight -= weights[i];
    }
    left.max(0.0)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::fill;

    #[test]
    fn shares_follow_weights_until_a_cap_binds() {
        let mut given = vec![0.0; 3];
        let left = fill(
            90.0,
            &[1.0, 1.0, 1.0],
            &[10.0, 100.0, 100.0],
            &mut given,
            &mut Vec::new(),
        );
        assert_eq!(given, vec![10.0, 40.0, 40.0]);
        assert_eq!(left, 0.0);
        let mut given = vec![0.0; 2];
        let left = fill(50.0, &[1.0, 3.0], &[5.0, 15.0], &mut given, &mut Vec::new());
        assert_eq!((given, left), (vec![5.0, 15.0], 30.0));
    }

    proptest! {
        /// Nothing is made or lost, no share passes its room, and where
        /// something is left every item that could take more is full.
        #[test]
        fn fill_conserves_and_respects_room(
            amount in 0.0f64..1e6,
            items in prop::collection::vec((0.0f64..100.0, 0.0f64..1e5), 0..20),
        ) {
            let (weights, room): (Vec<f64>, Vec<f64>) = items.into_iter().unzip();
            let mut given = vec![0.0; weights.len()];
            let left = fill(amount, &weights, &room, &mut given, &mut Vec::new());
            let total: f64 = given.iter().sum::<f64>() + left;
            prop_assert!((total - amount).abs() <= 1e-6 * amount.max(1.0));
            for i in 0..given.len() {
                prop_assert!(given[i] <= room[i] * (1.0 + 1e-12) + 1e-9);
                if weights[i] <= 0.0 {
                    prop_assert_eq!(given[i], 0.0);
                }
                if left > 1e-6 && weights[i] > 0.0 {
                    prop_assert!(given[i] >= room[i] * (1.0 - 1e-9) - 1e-9);
                }
            }
        }
    }
}
