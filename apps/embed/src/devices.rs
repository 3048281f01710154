//! Which device an embedding actor runs on: the CPU, or one GPU of its
//! node.
//!
//! An actor asks its node's [`GpuSlots`] for the least-held GPU and runs on
//! that CUDA device, so the actors of a node with N GPUs use GPUs 0 to N−1
//! (see [`flotilla::gpus`]). Where the node has no GPU, or this build has
//! no CUDA backend (the `cuda` feature), it runs on the CPU and says why;
//! asked for a GPU explicitly (`--device cuda`), it fails instead.
//!
//! ```text
//! DeviceChoice ─► cpu  ──────────────────────────────► flex (CPU)
//!              ─► auto ─► GPUs found? ─ yes ─► take slot i ─► cuda:i
//!                                     └ no ──► flex (CPU), with the reason
//!              ─► cuda ─► GPUs found? ─ yes ─► take slot i ─► cuda:i
//!                                     └ no ──► DeviceError
//! ```

use std::fmt;
use std::str::FromStr;

use burn::tensor::Device;
use flotilla::gpus::{GpuSlot, GpuSlots};

/// What the embedding actors are asked to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A GPU of the node when it has one and this build can use it, else
    /// the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// A GPU of the node; an error where there is none.
    Cuda,
}

impl DeviceChoice {
    /// The name `--device` takes and prints.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device name that is not `auto`, `cpu` or `cuda`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {0:?}: expected auto, cpu or cuda")]
pub struct UnknownDevice(pub String);

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda),
            _ => Err(UnknownDevice(s.to_owned())),
        }
    }
}

/// Why an actor asked for a GPU cannot have one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// This binary was built without the `cuda` feature.
    #[error("a GPU was asked for, but this build has no CUDA backend (build with --features cuda)")]
    NotBuilt,
    /// The node has no GPU this process can use.
    #[error("a GPU was asked for, but {0}")]
    NoGpu(String),
}

/// The device an actor got, and the GPU it holds while it runs there.
#[derive(Debug)]
pub struct ActorDevice {
    /// The device to load the model on.
    pub device: Device,
    /// `cpu` or `cuda:N`.
    pub label: String,
    /// The node's GPU held, released when dropped.
    pub slot: Option<GpuSlot>,
    /// Why an actor that could have had a GPU runs on the CPU.
    pub fallback: Option<String>,
}

/// The CUDA devices this process can use, in CUDA's order: none without
/// the `cuda` feature, or where `nvidia-smi` lists no GPU (Burn's CUDA
/// backend is not touched then, so a machine without a driver is safe).
pub fn cuda_devices() -> Vec<Device> {
    #[cfg(feature = "cuda")]
    {
        if flotilla::config::detect_gpus() == 0 {
            return Vec::new();
        }
        // Enumerating starts the CUDA runtime; a driver that fails there
        // must not take the node down with it.
        let found = std::panic::catch_unwind(|| {
            Device::enumerate(burn::tensor::DeviceType::Cuda)
                .into_iter()
                .collect::<Vec<_>>()
        });
        match found {
            Ok(devices) => devices,
            Err(_) => {
                tracing::warn!("nvidia-smi lists GPUs but CUDA failed to enumerate them");
                Vec::new()
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    Vec::new()
}

/// The CPU device: Burn's flex backend (or, built with `blas` and with
/// `FLOTILLA_DEVICE=ndarray`, ndarray with OpenBLAS).
pub fn cpu_device() -> Device {
    #[cfg(feature = "blas")]
    {
        if std::env::var("FLOTILLA_DEVICE").as_deref() == Ok("ndarray") {
            // Deprecated in Burn, kept only to measure against flex.
            #[allow(deprecated)]
            return Device::ndarray();
        }
    }
    Device::flex()
}

/// The device for an actor named `holder`, taking a GPU of `slots` when
/// `choice` allows one and `gpus` (the CUDA devices, [`cuda_devices`])
/// has the slot's index.
pub fn choose(
    choice: DeviceChoice,
    slots: &GpuSlots,
    gpus: &[Device],
    holder: &str,
) -> Result<ActorDevice, DeviceError> {
    decide(choice, slots, gpus, cfg!(feature = "cuda"), holder)
}

/// [`choose`], with whether this build has the CUDA backend passed in.
fn decide(
    choice: DeviceChoice,
    slots: &GpuSlots,
    gpus: &[Device],
    cuda_built: bool,
    holder: &str,
) -> Result<ActorDevice, DeviceError> {
    let cpu = |fallback: Option<String>| ActorDevice {
        device: cpu_device(),
        label: "cpu".into(),
        slot: None,
        fallback,
    };
    if choice == DeviceChoice::Cpu {
        return Ok(cpu(None));
    }
    if !cuda_built {
        if choice == DeviceChoice::Cuda {
            return Err(DeviceError::NotBuilt);
        }
        // GPUs this binary cannot use are worth a word; none, nothing.
        return Ok(cpu((slots.count() > 0).then(|| {
            format!(
                "the node has {} GPU(s) but this build has no CUDA backend (build with --features cuda)",
                slots.count()
            )
        })));
    }
    let why_not = match slots.take(holder) {
        None => {
            "the node offers no GPU (nvidia-smi lists none, or its `gpu` resource is 0)".to_owned()
        }
        Some(slot) => match gpus.get(slot.index()) {
            Some(device) => {
                return Ok(ActorDevice {
                    device: device.clone(),
                    label: format!("cuda:{}", slot.index()),
                    slot: Some(slot),
                    fallback: None,
                });
            }
            None if gpus.is_empty() => {
                "CUDA found no device (no NVIDIA driver, or none this process may use)".to_owned()
            }
            None => format!(
                "the node offers GPU {} but CUDA found only {}",
                slot.index(),
                gpus.len()
            ),
        },
    };
    match choice {
        DeviceChoice::Cuda => Err(DeviceError::NoGpu(why_not)),
        _ => Ok(cpu(Some(why_not))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        for c in [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda] {
            assert_eq!(c.as_str().parse::<DeviceChoice>(), Ok(c));
        }
        assert_eq!("GPU".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda));
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn cpu_is_the_cpu_and_holds_no_gpu() {
        let slots = GpuSlots::new(2);
        let d = choose(DeviceChoice::Cpu, &slots, &[], "a").unwrap();
        assert_eq!((d.label.as_str(), d.slot.is_none()), ("cpu", true));
        assert_eq!(d.fallback, None);
        assert_eq!(slots.report()[0].holders.len(), 0);
    }

    #[test]
    fn auto_without_a_usable_gpu_runs_on_the_cpu_and_says_why() {
        // A node reporting two GPUs that this process cannot use.
        let slots = GpuSlots::new(2);
        let d = choose(DeviceChoice::Auto, &slots, &[], "a").unwrap();
        assert_eq!(d.label, "cpu");
        assert!(d.fallback.is_some(), "the reason is given");
        assert!(d.slot.is_none());
        // A node without GPUs and no CUDA device.
        let none = GpuSlots::default();
        let d = choose(DeviceChoice::Auto, &none, &[], "a").unwrap();
        assert_eq!(d.label, "cpu");
    }

    #[test]
    fn asking_for_a_gpu_where_there_is_none_is_an_error() {
        let slots = GpuSlots::new(1);
        let e = decide(DeviceChoice::Cuda, &slots, &[], false, "a").unwrap_err();
        assert_eq!(e, DeviceError::NotBuilt);
        let e = decide(DeviceChoice::Cuda, &slots, &[], true, "a").unwrap_err();
        assert!(matches!(e, DeviceError::NoGpu(_)), "{e}");
        let e = decide(
            DeviceChoice::Cuda,
            &GpuSlots::default(),
            &[Device::flex()],
            true,
            "a",
        )
        .unwrap_err();
        assert!(e.to_string().contains("offers no GPU"), "{e}");
    }

    /// Stand-ins for CUDA devices: the mapping from slot to device is
    /// what is tested, not the device.
    #[test]
    fn actors_of_a_node_get_one_gpu_each_in_index_order() {
        let slots = GpuSlots::new(2);
        let gpus = [Device::flex(), Device::flex()];
        let pick = |choice, holder| decide(choice, &slots, &gpus, true, holder).unwrap();
        let a = pick(DeviceChoice::Auto, "a");
        let b = pick(DeviceChoice::Auto, "b");
        assert_eq!((a.label.as_str(), b.label.as_str()), ("cuda:0", "cuda:1"));
        assert_eq!((a.fallback.as_ref(), b.fallback.as_ref()), (None, None));
        drop(a);
        let c = pick(DeviceChoice::Cuda, "c");
        assert_eq!(c.label, "cuda:0");
        assert_eq!(slots.report()[0].holders, ["c"]);
        assert_eq!(slots.report()[1].holders, ["b"]);
    }

    #[test]
    fn a_gpu_slot_cuda_does_not_see_is_the_cpu_with_the_reason() {
        // The node declares two GPUs; CUDA sees one.
        let slots = GpuSlots::new(2);
        let gpus = [Device::flex()];
        let a = decide(DeviceChoice::Auto, &slots, &gpus, true, "a").unwrap();
        let b = decide(DeviceChoice::Auto, &slots, &gpus, true, "b").unwrap();
        assert_eq!((a.label.as_str(), b.label.as_str()), ("cuda:0", "cpu"));
        assert!(b.fallback.unwrap().contains("CUDA found only 1"));
    }
}
