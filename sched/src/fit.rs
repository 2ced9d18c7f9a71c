//! Feasibility now, for one request shape within a pass: which nodes fit, best first,
//! with the per-shape cache (`ShapeState`, `CachedFit`) that spares re-fitting nodes
//! nothing changed on.

use super::*;

impl Pass<'_> {
    /// Whether `req` fits node `i` now (for `d`, so until `b`), as a new cache entry:
    /// reusing what `cached` knew where the reservations it met are the same, and its
    /// score where the picks and the node's base are.
    #[inline]
    fn fit_outcome(
        &self,
        i: usize,
        req: &Request,
        d: Millis,
        b: Millis,
        cached: Option<CachedFit>,
    ) -> CachedFit {
        let cal = &self.cals[i];
        let (before, window) = cal.reservations_before(b);
        let outcome = match cached {
            // The same reservations as then: those that met it then and no new ones (the
            // count before b is the same).
            Some(c)
                if c.held_version == cal.held_version
                    && c.before == before
                    && c.window.0 < b
                    && b <= c.window.1 =>
            {
                c.outcome
            }
            _ => match self.fit(i, req, d) {
                Ok(picks) => {
                    // A score depends only on the node's base (what is held now) and on
                    // the picks: reservations added since that leave the same picks
                    // leave it.
                    let mask = slot_mask(&picks);
                    let score = match cached {
                        Some(CachedFit {
                            base_stamp,
                            outcome: Outcome::Fits(score, m),
                            ..
                        }) if base_stamp == self.bases[i].stamp && m == mask && mask != NO_MASK => {
                            score
                        }
                        _ => self.score(i, req, &picks),
                    };
                    Outcome::Fits(score, mask)
                }
                Err(m) if permanent(&m) => Outcome::Never,
                Err(Miss::Reserved { job, .. }) => Outcome::Reserved(job),
                Err(_) => Outcome::Busy,
            },
        };
        CachedFit {
            version: cal.version,
            held_version: cal.held_version,
            base_stamp: self.bases[i].stamp,
            before,
            window,
            outcome,
        }
    }

    /// Nodes where a job of `shape` (request `req`, time limit `d`) fits now, around
    /// reservations: best first, at most `want`; and, when they are fewer, the job whose
    /// reservation is in the way on the first node where one is. Nodes that cannot fit
    /// even ignoring reservations are skipped.
    pub(super) fn fit_now(
        &mut self,
        shape: usize,
        req: &Request,
        d: Millis,
        want: usize,
    ) -> (Vec<(usize, Picks)>, Option<JobId>) {
        self.refresh_max_free();
        if !Self::may_fit(&self.max_free, req) {
            return (Vec::new(), None);
        }
        // The shortcut's blocker may be out of date (a reservation made since could be
        // in the way now), so it is taken only where reasons are not reported.
        if let Some((shortest, blocker)) = self.shapes[shape].no_fit
            && d >= shortest
            && !self.config.expected_starts
        {
            return (Vec::new(), blocker);
        }
        let b = self.now.saturating_add(d);
        let enough = self.enough(want);
        let mut st = std::mem::take(&mut self.shapes[shape]);
        if st.fits.is_empty() {
            st.live = self.eligible.clone();
            st.fits = vec![None; self.cluster.nodes.len()];
        }
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        // The best so far (score, node) and how many fit: single-node jobs need no list.
        let (mut best, mut fitting): (Option<(f64, usize)>, usize) = (None, 0);
        let order = |x: &(f64, usize), y: &(f64, usize)| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1));
        let mut blocker = None;
        let mut next = 0;
        while next < st.live.len() && fitting < enough {
            let i = st.live[next];
            next += 1;
            if i == GONE {
                continue;
            }
            let unchanged = st.fits[i].filter(|c| c.version == self.versions[i]);
            // (An unchanged node passed this check when its answer was cached.)
            if unchanged.is_none() && !Self::may_fit(&self.frees[i], req) {
                st.live[next - 1] = GONE;
                st.gone += 1;
                continue;
            }
            let outcome = match st.fits[i] {
                // Nothing changed here since, and the window meets the same reservations.
                Some(c) if unchanged.is_some() && c.window.0 < b && b <= c.window.1 => c.outcome,
                // Every reservation it met still starts inside this window (and more may):
                // it stays blocked. Only the job named could differ, and only the first
                // blocker found is reported.
                Some(CachedFit {
                    held_version,
                    window,
                    outcome: o @ Outcome::Reserved(_),
                    ..
                }) if blocker.is_some()
                    && held_version == self.cals[i].held_version
                    && window.0 < b =>
                {
                    o
                }
                cached => {
                    let fresh = self.fit_outcome(i, req, d, b, cached);
                    st.fits[i] = Some(fresh);
                    fresh.outcome
                }
            };
            match outcome {
                Outcome::Fits(score, _) => {
                    fitting += 1;
                    if want == 1 {
                        // The list is in node order: on equal scores the earlier stays,
                        // as `order` has it.
                        debug_assert!(best.is_none_or(|b| b.1 < i));
                        if best.is_none_or(|b| score.total_cmp(&b.0).is_lt()) {
                            best = Some((score, i));
                        }
                    } else {
                        found.push((score, i));
                    }
                }
                // Busy is for good too: held claims alone decide it, they only add up
                // during a pass, and their use is highest at `now` whatever the window.
                Outcome::Never | Outcome::Busy => {
                    st.live[next - 1] = GONE;
                    st.gone += 1;
                }
                Outcome::Reserved(job) => {
                    blocker.get_or_insert(job);
                }
            }
        }
        if st.gone * 8 > st.live.len() {
            st.live.retain(|&i| i != GONE);
            st.gone = 0;
        }
        if fitting < want {
            st.no_fit = Some((d, blocker));
        }
        self.shapes[shape] = st;
        // The best `want` of them, best first (scores tie-break on the node index).
        if want == 1 {
            found.extend(best);
        } else {
            if found.len() > want && want > 0 {
                found.select_nth_unstable_by(want - 1, order);
            }
            found.truncate(want);
            found.sort_unstable_by(order);
        }
        let picked = found
            .iter()
            .map(|&(_, i)| {
                let picks = self.fit(i, req, d).expect("cached as fitting");
                (i, picks)
            })
            .collect();
        self.found = found;
        (picked, blocker)
    }

    /// `fit_now` for `explain`: every node looked at and every miss recorded, no cache;
    /// the same choice as `fit_now`.
    pub(super) fn fit_now_all(
        &mut self,
        req: &Request,
        d: Millis,
        want: usize,
        misses: &mut Vec<(usize, Miss)>,
    ) -> Vec<(usize, Picks)> {
        let enough = self.enough(want);
        let mut found: Vec<(f64, usize, Picks)> = Vec::new();
        for i in 0..self.cluster.nodes.len() {
            match self.fit_scored(i, req, d) {
                Ok(_) if found.len() >= enough => {}
                Ok((s, picks)) => found.push((s, i, picks)),
                Err(m) => misses.push((i, m)),
            }
        }
        found.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        found.truncate(want);
        found.into_iter().map(|(_, i, p)| (i, p)).collect()
    }
}
