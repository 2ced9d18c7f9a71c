//! Fair share: decayed usage per account and user, and the priority factor it gives.
//!
//! Usage is charged in normalised GPU-seconds (a whole GPU for a second is 1, a quarter
//! share a quarter, a MIG instance its fraction of the GPU, each optionally times its
//! model's weight) and decays with a half-life, like Slurm's `PriorityDecayHalfLife`.
//! The factor of a job is `2^-r` (Slurm's classic formula), where `r` is how far its
//! owner is over their share: `r = (r_account + r_user) / 2`, with
//! - `r_account` = the account's part of all usage / its part of all shares, and
//! - `r_user` = the user's part of all usage / the user's part of all shares (their
//!   account's share split among its users by their user shares).
//!
//! So 1.0 is "nothing used", 0.5 "used exactly its share", and less "used more"; an
//! account over its share drags all its users down, and a user over their slice of the
//! account drags themselves. Pure: the controller charges at its passes, with `now`
//! passed in.

use std::collections::BTreeMap;

use super::model::Millis;

/// Decayed usage, in normalised GPU-seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// (account, user) -> decayed usage.
    pub by_user: BTreeMap<(String, String), f64>,
    /// When usage was last decayed to (Unix ms).
    pub as_of_ms: Millis,
}

/// The shares one owner holds (from the config; unknown accounts and users hold 1).
pub trait Shares {
    fn account(&self, account: &str) -> f64;
    fn user(&self, account: &str, user: &str) -> f64;
}

/// Every account and user holds one share.
pub struct Equal;

impl Shares for Equal {
    fn account(&self, _: &str) -> f64 {
        1.0
    }
    fn user(&self, _: &str, _: &str) -> f64 {
        1.0
    }
}

impl Usage {
    /// Decays all usage from `as_of_ms` to `now` (never backwards).
    pub fn decay_to(&mut self, now: Millis, half_life_ms: Millis) {
        if now <= self.as_of_ms {
            return;
        }
        if self.as_of_ms > 0 && half_life_ms > 0 {
            let k = 0.5f64.powf((now - self.as_of_ms) as f64 / half_life_ms as f64);
            self.by_user.retain(|_, u| {
                *u *= k;
                // Below a GPU-millisecond it is noise: forget it.
                *u > 1e-3
            });
        }
        self.as_of_ms = now;
    }

    /// Adds `gpu_seconds` (normalised) to a user of an account.
    pub fn charge(&mut self, account: &str, user: &str, gpu_seconds: f64) {
        if gpu_seconds > 0.0 && gpu_seconds.is_finite() {
            *self
                .by_user
                .entry((account.to_string(), user.to_string()))
                .or_default() += gpu_seconds;
        }
    }

    pub fn total(&self) -> f64 {
        self.by_user.values().sum()
    }

    pub fn of_account(&self, account: &str) -> f64 {
        self.by_user
            .range((account.to_string(), String::new())..)
            .take_while(|((a, _), _)| a == account)
            .map(|(_, u)| u)
            .sum()
    }

    /// The fair-share table of these owners (those with usage plus `also`, e.g. the
    /// owners of pending jobs): the factor of each, in milli (1000 = nothing used).
    pub fn table<'a>(
        &self,
        also: impl IntoIterator<Item = (&'a str, &'a str)>,
        shares: &dyn Shares,
    ) -> FairShareTable {
        let mut users: BTreeMap<(String, String), f64> = self.by_user.clone();
        for (a, u) in also {
            users.entry((a.to_string(), u.to_string())).or_insert(0.0);
        }
        // Per account: its usage, and the shares of its users.
        let mut accounts: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for ((a, u), use_) in &users {
            if !accounts.contains_key(a) {
                accounts.insert(a.clone(), (0.0, 0.0));
            }
            let e = accounts.get_mut(a).expect("inserted above");
            e.0 += use_;
            e.1 += shares.user(a, u).max(0.0);
        }
        let total_use: f64 = accounts.values().map(|x| x.0).sum();
        let total_shares: f64 = accounts.keys().map(|a| shares.account(a).max(0.0)).sum();
        let ratio = |used: f64, share: f64| -> f64 {
            if used <= 0.0 || total_use <= 0.0 {
                0.0
            } else if share <= 0.0 {
                f64::INFINITY
            } else {
                (used / total_use) / share
            }
        };
        let mut rows = Vec::with_capacity(users.len());
        for ((a, u), used) in users {
            let (acct_use, user_shares) = accounts[&a];
            let acct_share = if total_shares > 0.0 {
                shares.account(&a).max(0.0) / total_shares
            } else {
                0.0
            };
            let user_share = if user_shares > 0.0 {
                acct_share * shares.user(&a, &u).max(0.0) / user_shares
            } else {
                0.0
            };
            let r = (ratio(acct_use, acct_share) + ratio(used, user_share)) / 2.0;
            let factor = 0.5f64.powf(r);
            rows.push(Row {
                account: a,
                user: u,
                norm_shares: user_share,
                account_shares: acct_share,
                usage: used,
                effective_usage: if total_use > 0.0 {
                    used / total_use
                } else {
                    0.0
                },
                factor_milli: (factor * 1000.0).round().clamp(0.0, 1000.0) as u32,
            });
        }
        FairShareTable { rows }
    }
}

/// One owner's line of the fair-share table (like a line of Slurm's `sshare`).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub account: String,
    pub user: String,
    /// The user's part of all shares (their account's part split among its users).
    pub norm_shares: f64,
    /// The account's part of all shares.
    pub account_shares: f64,
    /// Decayed usage, normalised GPU-seconds.
    pub usage: f64,
    /// The user's part of all decayed usage.
    pub effective_usage: f64,
    /// The factor, 0..=1000 (1000 = nothing used, 500 = exactly its share).
    pub factor_milli: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FairShareTable {
    pub rows: Vec<Row>,
}

impl FairShareTable {
    /// The factor of a user of an account (1000 for owners not in the table).
    pub fn factor(&self, account: &str, user: &str) -> u32 {
        self.rows
            .binary_search_by(|r| (r.account.as_str(), r.user.as_str()).cmp(&(account, user)))
            .map_or(1000, |i| self.rows[i].factor_milli)
    }
}

/// The fraction of a GPU a MIG profile is ("3g.40gb" -> 3/7 on a GPU of 7 slices).
pub fn mig_fraction(profile: &str) -> f64 {
    profile
        .split('g')
        .next()
        .and_then(|n| n.parse::<u32>().ok())
        .map_or(1.0, |g| (f64::from(g) / 7.0).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_halves_per_half_life() {
        let mut u = Usage::default();
        u.decay_to(1_000, 3_600_000);
        u.charge("a", "alice", 100.0);
        u.decay_to(1_000 + 3_600_000, 3_600_000);
        assert!((u.total() - 50.0).abs() < 1e-9);
        u.decay_to(1_000, 3_600_000); // never backwards
        assert!((u.total() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn factor_follows_usage_over_share() {
        let mut u = Usage::default();
        u.charge("a", "alice", 300.0);
        u.charge("b", "bob", 100.0);
        let t = u.table([("c", "carol")], &Equal);
        // carol used nothing: 1.0; bob used 1/4 of all with 1/3 of the shares.
        assert_eq!(t.factor("c", "carol"), 1000);
        let bob = 0.5f64.powf(0.25 / (1.0 / 3.0));
        assert_eq!(t.factor("b", "bob"), (bob * 1000.0).round() as u32);
        assert!(t.factor("a", "alice") < t.factor("b", "bob"));
        assert_eq!(t.factor("x", "nobody"), 1000);
    }

    #[test]
    fn a_user_over_their_slice_drops_below_their_accountmate() {
        let mut u = Usage::default();
        u.charge("a", "alice", 90.0);
        u.charge("a", "ann", 10.0);
        u.charge("b", "bob", 100.0);
        let t = u.table([], &Equal);
        assert!(t.factor("a", "alice") < t.factor("a", "ann"));
        // The accounts are even; ann is under her slice, bob exactly at his.
        assert!(t.factor("a", "ann") > t.factor("b", "bob"));
        assert_eq!(t.factor("b", "bob"), 500);
    }

    #[test]
    fn mig_fractions() {
        assert!((mig_fraction("3g.40gb") - 3.0 / 7.0).abs() < 1e-12);
        assert!((mig_fraction("7g.80gb") - 1.0).abs() < 1e-12);
        assert_eq!(mig_fraction("odd"), 1.0);
    }
}
