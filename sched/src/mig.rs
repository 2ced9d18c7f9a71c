//! MIG profiles by GPU model and where each may sit on its GPU, for dynamic MIG: a
//! layout is checked (the agent's fake backend refuses what the driver would) and
//! planned from what waits (the controller). From NVIDIA's MIG user guide, "Supported
//! MIG profiles": a GPU has 8 memory slots (A30: 4); each GPU instance profile takes
//! `size` of them at one of its allowed starts (A100-80GB: `1g.10gb` size 1 at 0-6,
//! `1g.20gb` size 2 at 0/2/4/6, `2g.20gb` size 2 at 0/2/4, `3g.40gb` size 4 at 0/4,
//! `4g.40gb` size 4 at 0, `7g.80gb` all 8), and instances never overlap. So seven
//! `1g.10gb` fit, `4g.40gb` + `3g.40gb` fit, two `4g.40gb` do not.

/// One GPU instance profile: its name, its size in memory slots, where it may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    pub size: u8,
    pub starts: &'static [u8],
}

/// What MIG offers on one GPU model.
#[derive(Debug, PartialEq, Eq)]
pub struct Model {
    pub name: &'static str,
    pub slots: u8,
    pub profiles: [Profile; 6],
}

const ANY7: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN4: &[u8] = &[0, 2, 4, 6];
const EVEN3: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

/// The profiles of a GPU of 8 memory slots, by their names on it.
const fn eight(name: &'static str, p: [&'static str; 6]) -> Model {
    Model {
        name,
        slots: 8,
        profiles: [
            Profile {
                name: p[0],
                size: 1,
                starts: ANY7,
            },
            Profile {
                name: p[1],
                size: 2,
                starts: EVEN4,
            },
            Profile {
                name: p[2],
                size: 2,
                starts: EVEN3,
            },
            Profile {
                name: p[3],
                size: 4,
                starts: HALVES,
            },
            Profile {
                name: p[4],
                size: 4,
                starts: FIRST,
            },
            Profile {
                name: p[5],
                size: 8,
                starts: FIRST,
            },
        ],
    }
}

const A100_40: Model = eight(
    "A100-40GB",
    [
        "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ],
);
const A100_80: Model = eight(
    "A100-80GB",
    [
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
);
const H100_80: Model = eight(
    "H100-80GB",
    [
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
);
const H100_94: Model = eight(
    "H100-94GB",
    [
        "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    ],
);
const H200: Model = eight(
    "H200-141GB",
    [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ],
);
/// The A30: 4 memory slots (its `1g.6gb` at 0-3, `2g.12gb` at 0/2, `4g.24gb` whole);
/// the last two entries repeat its whole-GPU profile so that every model has six.
const A30: Model = Model {
    name: "A30-24GB",
    slots: 4,
    profiles: [
        Profile {
            name: "1g.6gb",
            size: 1,
            starts: &[0, 1, 2, 3],
        },
        Profile {
            name: "2g.12gb",
            size: 2,
            starts: &[0, 2],
        },
        Profile {
            name: "4g.24gb",
            size: 4,
            starts: FIRST,
        },
        Profile {
            name: "4g.24gb",
            size: 4,
            starts: FIRST,
        },
        Profile {
            name: "4g.24gb",
            size: 4,
            starts: FIRST,
        },
        Profile {
            name: "4g.24gb",
            size: 4,
            starts: FIRST,
        },
    ],
};

/// The MIG model of a GPU named as the driver or `--fake-gpus` names it
/// ("NVIDIA A100-SXM4-80GB", "A100-80GB", "NVIDIA H100 NVL"...); `None`: no MIG.
pub fn model_of(gpu: &str) -> Option<&'static Model> {
    let g = gpu.to_ascii_uppercase();
    let has = |s: &str| g.contains(s);
    Some(if has("A100") {
        if has("40GB") { &A100_40 } else { &A100_80 }
    } else if has("H100") {
        if has("94GB") || has("NVL") {
            &H100_94
        } else {
            &H100_80
        }
    } else if has("H200") {
        &H200
    } else if has("A30") {
        &A30
    } else {
        return None;
    })
}

impl Model {
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// Places `layout`'s instances where the rules allow (a search over their allowed
    /// starts, largest first): their starts in `layout`'s order, or why the GPU
    /// cannot hold them.
    pub fn place(&self, layout: &[&str]) -> Result<Vec<u8>, String> {
        let mut order: Vec<(usize, &Profile)> = Vec::with_capacity(layout.len());
        for (i, name) in layout.iter().enumerate() {
            let p = self.profile(name).ok_or_else(|| {
                let known: Vec<&str> = self.profiles.iter().map(|p| p.name).collect();
                format!(
                    "{} has no MIG profile {name:?} (it has {})",
                    self.name,
                    known.join(", ")
                )
            })?;
            order.push((i, p));
        }
        order.sort_by_key(|(i, p)| (std::cmp::Reverse(p.size), *i));
        let mut starts = vec![0u8; layout.len()];
        if fit(&order, 0, &mut starts) {
            Ok(starts)
        } else {
            Err(format!(
                "{} cannot hold {}: no placement of them all (MIG placement rules)",
                self.name,
                layout.join("+")
            ))
        }
    }

    /// A layout for an empty GPU from the instances that wait, in the order they
    /// should be served: each that still fits is taken; what does not waits for
    /// another GPU. Empty when none fits.
    pub fn plan(&self, wanted: &[&str]) -> Vec<String> {
        let mut layout: Vec<&str> = Vec::new();
        for w in wanted {
            let Some(p) = self.profile(w) else { continue };
            layout.push(p.name);
            if self.place(&layout).is_err() {
                layout.pop();
            }
        }
        layout.into_iter().map(str::to_string).collect()
    }
}

/// Places `order` (from its first) on slots not in `used`, writing each start.
fn fit(order: &[(usize, &Profile)], used: u16, starts: &mut [u8]) -> bool {
    let Some(((i, p), rest)) = order.split_first() else {
        return true;
    };
    let mask = |s: u8| ((1u16 << p.size) - 1) << s;
    for &s in p.starts {
        if used & mask(s) == 0 && fit(rest, used | mask(s), starts) {
            starts[*i] = s;
            return true;
        }
    }
    false
}

/// The slots a dynamic-MIG node's GPUs (`gpus`, each as a whole slot) could be laid out
/// as for `gpu`: for a MIG request, as many instances of its profile as each GPU whose
/// model has it can hold (named `UUID-i`); for any other, the GPUs whole. What the
/// controller admits a job to such a node by, and the simulator too.
pub fn dynamic_slots(gpus: &[crate::SlotView], gpu: &crate::GpuRequest) -> Vec<crate::SlotView> {
    let crate::GpuRequest::Mig { profile, .. } = gpu else {
        return gpus.to_vec();
    };
    let mut slots = Vec::new();
    for g in gpus {
        let Some(model) = model_of(&g.model) else {
            continue;
        };
        let Some(p) = model.profile(profile) else {
            continue;
        };
        let memory = profile_memory_mib(p.name).unwrap_or(0);
        for i in 0..model.plan(&[p.name; 8]).len() {
            slots.push(crate::SlotView {
                uuid: format!("{}-{i}", g.uuid),
                gpu_index: g.gpu_index,
                model: g.model.clone(),
                memory_mib: memory,
                mig_profile: Some(p.name.to_string()),
            });
        }
    }
    slots
}

/// The memory of a profile in MiB, from its name ("3g.40gb" -> 40 GiB).
pub fn profile_memory_mib(profile: &str) -> Option<u64> {
    let gb = profile.split_once("g.")?.1.strip_suffix("gb")?;
    Some(gb.parse::<u64>().ok()? * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_as_nvidia_documents_them() {
        let a100 = model_of("NVIDIA A100-SXM4-80GB").unwrap();
        assert_eq!(a100.name, "A100-80GB");
        assert_eq!(
            a100.place(&["1g.10gb"; 7]).unwrap(),
            vec![0, 1, 2, 3, 4, 5, 6]
        );
        assert!(a100.place(&["1g.10gb"; 8]).is_err(), "seven at most");
        assert_eq!(a100.place(&["3g.40gb", "4g.40gb"]).unwrap(), vec![4, 0]);
        assert!(a100.place(&["4g.40gb", "4g.40gb"]).is_err());
        // 3g at 0 leaves 2g at 4 and a 1g at 6, and no start for the last 1g (1g
        // starts at 0-6): the rules put the 3g at 4 instead.
        assert_eq!(
            a100.place(&["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
                .unwrap(),
            vec![4, 0, 2, 3]
        );
        assert!(a100.place(&["7g.80gb", "1g.10gb"]).is_err());
        assert!(
            a100.place(&["2g.40gb"])
                .unwrap_err()
                .contains("no MIG profile")
        );
        let a30 = model_of("NVIDIA A30").unwrap();
        assert!(a30.place(&["2g.12gb", "2g.12gb"]).is_ok());
        assert!(a30.place(&["2g.12gb", "2g.12gb", "1g.6gb"]).is_err());
        assert!(model_of("Tesla T4").is_none());
        assert_eq!(
            model_of("H200").unwrap().profile("3g.71gb").unwrap().size,
            4
        );
        assert_eq!(profile_memory_mib("3g.40gb"), Some(40 * 1024));
    }

    #[test]
    fn a_plan_takes_what_fits_in_the_order_served() {
        let a100 = model_of("A100-80GB").unwrap();
        assert_eq!(a100.plan(&["1g.10gb"; 9]), vec!["1g.10gb"; 7]);
        assert_eq!(
            a100.plan(&["4g.40gb", "4g.40gb", "3g.40gb", "1g.10gb"]),
            vec!["4g.40gb", "3g.40gb"]
        );
        assert_eq!(
            a100.plan(&["3g.40gb", "7g.80gb", "2g.20gb"]),
            vec!["3g.40gb", "2g.20gb"]
        );
        assert!(a100.plan(&["1g.6gb"]).is_empty(), "another model's profile");
    }
}
