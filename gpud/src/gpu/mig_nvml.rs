//! Dynamic MIG through NVML: a GPU that holds no job gets a new layout (its GPU and
//! compute instances destroyed, MIG mode switched as needed, the new instances created
//! at the starts `sched::mig` places them). nvml-wrapper 0.11 wraps none of these
//! calls; they go through nvml-wrapper-sys on the library NVML loaded, each symbol
//! checked first. NVML names no profile by its `1g.10gb` name: each of the GPU's
//! profile ids is asked for its slices and memory, named as `nvidia-smi` names them
//! (memory rounded up to GB), and the first id of a name is used (the plain profile,
//! not its `+me` variant). A failure puts the layout the GPU had back where it can.
//!
//! This project's CI has no GPU: this path runs on NVIDIA hardware only through
//! `scripts/gpu-check.sh`, where a device is lent.

use nvml_wrapper_sys::bindings as b;

use super::{GpuError, Nvml};

/// An NVML return code as an error of `what`.
fn check(rc: b::nvmlReturn_t, what: &str) -> Result<(), GpuError> {
    if rc == b::nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Nvml(format!("{what} returned NVML error {rc}")))
    }
}

/// The GPU's instance profiles by name: (name, profile id, slices).
fn profiles(lib: &b::NvmlLib, h: b::nvmlDevice_t) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for p in 0..b::NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: a zeroed plain C struct as an out-parameter.
        let mut info: b::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid device handle and an out-pointer to a local.
        let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(h, p, &mut info) };
        if rc != b::nvmlReturn_enum_NVML_SUCCESS {
            continue;
        }
        let name = format!(
            "{}g.{}gb",
            info.sliceCount,
            info.memorySizeMB.div_ceil(1024)
        );
        if !out.iter().any(|(n, _, _)| *n == name) {
            out.push((name, info.id, info.sliceCount));
        }
    }
    out
}

/// Destroys every compute and GPU instance of the GPU.
fn destroy_all(lib: &b::NvmlLib, h: b::nvmlDevice_t) -> Result<(), GpuError> {
    for p in 0..b::NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: zeroed plain C struct, out-pointer to a local.
        let mut info: b::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid device handle.
        if unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(h, p, &mut info) }
            != b::nvmlReturn_enum_NVML_SUCCESS
        {
            continue;
        }
        let mut gis: Vec<b::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 8];
        let mut count = 0u32;
        // SAFETY: a buffer of 8 handles (a GPU has at most 7 instances) and a count.
        let rc = unsafe { lib.nvmlDeviceGetGpuInstances(h, info.id, gis.as_mut_ptr(), &mut count) };
        check(rc, "nvmlDeviceGetGpuInstances")?;
        for &gi in gis.iter().take(count as usize) {
            for cp in 0..b::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                let mut cis: Vec<b::nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 8];
                let mut n = 0u32;
                // SAFETY: a GPU instance handle NVML gave, a buffer of 8 and a count.
                let rc = unsafe {
                    lib.nvmlGpuInstanceGetComputeInstances(gi, cp, cis.as_mut_ptr(), &mut n)
                };
                if rc != b::nvmlReturn_enum_NVML_SUCCESS {
                    continue;
                }
                for &ci in cis.iter().take(n as usize) {
                    // SAFETY: a compute instance handle NVML gave.
                    check(
                        unsafe { lib.nvmlComputeInstanceDestroy(ci) },
                        "nvmlComputeInstanceDestroy",
                    )?;
                }
            }
            // SAFETY: a GPU instance handle NVML gave, its compute instances gone.
            check(
                unsafe { lib.nvmlGpuInstanceDestroy(gi) },
                "nvmlGpuInstanceDestroy",
            )?;
        }
    }
    Ok(())
}

/// The compute instance profile that takes a whole GPU instance of `slices`.
fn compute_profile(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => b::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => b::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => b::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => b::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => b::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => b::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => b::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// Creates the instances `placed` names (profile, start and size in memory slots),
/// each with one compute instance over all of it.
fn create(lib: &b::NvmlLib, h: b::nvmlDevice_t, placed: &[(&str, u8, u8)]) -> Result<(), GpuError> {
    let known = profiles(lib, h);
    let with_place = lib.nvmlDeviceCreateGpuInstanceWithPlacement.is_ok();
    for &(name, start, size) in placed {
        let Some(&(_, id, slices)) = known.iter().find(|(n, _, _)| n == name) else {
            return Err(GpuError::Nvml(format!(
                "this GPU's NVML offers no MIG profile {name}"
            )));
        };
        let mut gi: b::nvmlGpuInstance_t = std::ptr::null_mut();
        let rc = if with_place {
            let at = b::nvmlGpuInstancePlacement_t {
                start: u32::from(start),
                size: u32::from(size),
            };
            // SAFETY: a valid device handle, a placement on the stack, an out-pointer.
            unsafe { lib.nvmlDeviceCreateGpuInstanceWithPlacement(h, id, &at, &mut gi) }
        } else {
            // SAFETY: as above; NVML then chooses the place.
            unsafe { lib.nvmlDeviceCreateGpuInstance(h, id, &mut gi) }
        };
        check(rc, &format!("creating GPU instance {name} at {start}"))?;
        let cp = compute_profile(slices)
            .ok_or_else(|| GpuError::Nvml(format!("no compute profile of {slices} slices")))?;
        // SAFETY: zeroed plain C struct as an out-parameter.
        let mut ci_info: b::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the GPU instance just created, an out-pointer to a local.
        let rc = unsafe {
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                cp,
                b::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut ci_info,
            )
        };
        check(rc, "nvmlGpuInstanceGetComputeInstanceProfileInfo")?;
        let mut ci: b::nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id, &mut ci) };
        check(rc, &format!("creating the compute instance of {name}"))?;
    }
    Ok(())
}

/// Switches MIG mode to `on` if it is not; an activation that needs a GPU reset is an
/// error (the GPU stays as it was until an admin resets it).
fn mig_mode(lib: &b::NvmlLib, h: b::nvmlDevice_t, on: bool) -> Result<(), GpuError> {
    let (mut current, mut pending) = (0u32, 0u32);
    // SAFETY: a valid device handle and out-pointers to locals.
    check(
        unsafe { lib.nvmlDeviceGetMigMode(h, &mut current, &mut pending) },
        "nvmlDeviceGetMigMode",
    )?;
    let want = if on {
        b::NVML_DEVICE_MIG_ENABLE
    } else {
        b::NVML_DEVICE_MIG_DISABLE
    };
    if current == want {
        return Ok(());
    }
    let mut activation: b::nvmlReturn_t = b::nvmlReturn_enum_NVML_SUCCESS;
    // SAFETY: as above.
    check(
        unsafe { lib.nvmlDeviceSetMigMode(h, want, &mut activation) },
        "nvmlDeviceSetMigMode",
    )?;
    check(
        activation,
        "MIG mode activation (it may need a GPU reset: nvidia-smi -r)",
    )
}

/// Reconfigures GPU `uuid` to `layout` (see the module's doc).
pub(super) fn set_layout(n: &Nvml, uuid: &str, layout: &[String]) -> Result<(), GpuError> {
    let en = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
    let lib = (n.sys.as_ref())
        .filter(|l| {
            l.nvmlDeviceSetMigMode.is_ok()
                && l.nvmlDeviceGetMigMode.is_ok()
                && l.nvmlDeviceCreateGpuInstance.is_ok()
                && l.nvmlGpuInstanceCreateComputeInstance.is_ok()
                && l.nvmlDeviceGetGpuInstances.is_ok()
                && l.nvmlGpuInstanceDestroy.is_ok()
                && l.nvmlComputeInstanceDestroy.is_ok()
                && l.nvmlGpuInstanceGetComputeInstances.is_ok()
        })
        .ok_or_else(|| GpuError::Nvml("this NVML has no MIG configuration calls".into()))?;
    let d = n.nvml.device_by_uuid(uuid).map_err(en)?;
    let model = d.name().map_err(en)?;
    // The layout it has now, to put back if the new one fails.
    let before: Vec<String> = n
        .mig_instances(&d)?
        .into_iter()
        .map(|m| m.profile)
        .collect();
    // SAFETY: the handle is only passed to NVML calls, while `d` lives.
    let h = unsafe { d.handle() };
    let apply = |layout: &[&str]| -> Result<(), GpuError> {
        if layout.is_empty() {
            destroy_all(lib, h)?;
            return mig_mode(lib, h, false);
        }
        let rules = gpuctl_sched::mig::model_of(&model)
            .ok_or_else(|| GpuError::Nvml(format!("{model} offers no MIG")))?;
        let starts = rules.place(layout).map_err(GpuError::Nvml)?;
        let placed: Vec<(&str, u8, u8)> = (layout.iter().zip(starts))
            .map(|(name, start)| (*name, start, rules.profile(name).map_or(1, |p| p.size)))
            .collect();
        mig_mode(lib, h, true)?;
        destroy_all(lib, h)?;
        create(lib, h, &placed)
    };
    let wanted: Vec<&str> = layout.iter().map(String::as_str).collect();
    apply(&wanted).inspect_err(|_| {
        let old: Vec<&str> = before.iter().map(String::as_str).collect();
        if let Err(e) = apply(&old) {
            tracing::error!(gpu = %uuid, "could not put the GPU's MIG layout back: {e}");
        }
    })
}
