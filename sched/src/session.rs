//! `Session`: one job at a time against a cluster that keeps its state between calls
//! (the simulator's inflation experiment), with the scheduler's own placement.

use super::*;

/// One job at a time against a cluster that keeps its state between calls, with no
/// queue and no reservations: the FGD inflation experiment places arrivals this way.
/// Placement and packing are exactly the scheduler's.
pub struct Session<'a> {
    pass: Pass<'a>,
    /// Each eligible node's fragmentation (0 for the others), kept up to date by
    /// `start_now`, and their sum.
    node_frags: Vec<f64>,
    total_frag: f64,
}

impl<'a> Session<'a> {
    pub fn new(cluster: &'a ClusterView, config: &'a SchedConfig, now: Millis) -> Session<'a> {
        let mut s = Session {
            pass: Pass::new(cluster, config, now),
            node_frags: vec![0.0; cluster.nodes.len()],
            total_frag: 0.0,
        };
        for i in s.pass.eligible.clone() {
            s.node_frags[i] = s.node_frag(i);
        }
        s.total_frag = s.node_frags.iter().sum();
        s
    }

    /// Starts the job now if it fits now, holding its slots for `duration_ms`.
    pub fn start_now(&mut self, job: JobId, req: &Request, duration_ms: Millis) -> Option<Start> {
        let gang = req.nodes.max(1) as usize;
        let d = duration_ms.max(1);
        let shape = self.pass.shape(req);
        let (fits, _) = self.pass.fit_now(shape, req, d, gang);
        if fits.len() < gang {
            return None;
        }
        let now = self.pass.now;
        let mut allocs = Vec::new();
        for (i, picks) in fits {
            self.pass
                .claim(job, i, &picks, req, (now, now.saturating_add(d)), false);
            allocs.push(alloc_of(&self.pass.cluster.nodes[i], &picks, req));
            let after = self.node_frag(i);
            self.total_frag += after - self.node_frags[i];
            self.node_frags[i] = after;
        }
        Some(Start { job, allocs })
    }

    /// GPU milli held now, over all nodes.
    pub fn allocated_milli(&self) -> u64 {
        self.pass
            .cals
            .iter()
            .flat_map(|c| c.slot_free_now.iter().map(|f| u64::from(GPU_MILLI - f.0)))
            .sum()
    }

    fn node_frag(&self, i: usize) -> f64 {
        let p = &self.pass;
        let node = &p.cluster.nodes[i];
        let free = p.cals[i].gpu_free_milli(node, p.now);
        p.frag.node_frag(node, &free, p.cals[i].host_free_now())
    }

    /// Cluster fragmentation in GPU milli (FGD's measure, against the config's workload).
    pub fn fragmentation(&self) -> f64 {
        self.total_frag
    }
}
