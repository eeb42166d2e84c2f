//! DLPack export of a lease (the Python specification of `__dlpack__`,
//! and `dlpack.h` ≥ 1.0 for the structs): a `DLManagedTensorVersioned` in
//! a capsule named `dltensor_versioned`, the read-only flag set.
//!
//! Ownership follows the specification: until a consumer takes the tensor
//! (renaming the capsule `used_dltensor_versioned`), the capsule owns it
//! and its destructor calls the deleter; after, the consumer calls the
//! deleter when its array is gone, from whatever thread. The deleter frees
//! the [`Export`] and with it its [`View`], which uncounts itself from the
//! lease (and may release the claim: see `lease.rs`).

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::held::View;

/// `(kDLCPU, 0)`: the device of every lease.
pub(crate) const CPU_DEVICE: (i32, i32) = (K_DL_CPU, 0);

const K_DL_CPU: i32 = 1;

/// `DLDeviceType`'s names (dlpack.h), for messages.
const DEVICE_TYPES: &[(i32, &str)] = &[
    (1, "kDLCPU"),
    (2, "kDLCUDA"),
    (3, "kDLCUDAHost"),
    (4, "kDLOpenCL"),
    (7, "kDLVulkan"),
    (8, "kDLMetal"),
    (9, "kDLVPI"),
    (10, "kDLROCM"),
    (11, "kDLROCMHost"),
    (12, "kDLExtDev"),
    (13, "kDLCUDAManaged"),
    (14, "kDLOneAPI"),
    (15, "kDLWebGPU"),
    (16, "kDLHexagon"),
    (17, "kDLMAIA"),
];

/// A DLPack device as Python writes the pair, with its type's name:
/// `(2, 0) (kDLCUDA)`.
pub(crate) fn device_name((device_type, device_id): (i32, i32)) -> String {
    match DEVICE_TYPES.iter().find(|(t, _)| *t == device_type) {
        Some((_, name)) => format!("({device_type}, {device_id}) ({name})"),
        None => format!("({device_type}, {device_id}) (an unknown device type)"),
    }
}
/// `kDLUInt`.
const K_DL_UINT: u8 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

const CAPSULE_NAME: &CStr = c"dltensor_versioned";

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The tensor handed out, with what its pointers point at. `managed` is
/// the first field of a `repr(C)` struct, so a pointer to it is a pointer
/// to the whole.
#[repr(C)]
struct Export {
    managed: DLManagedTensorVersioned,
    shape: [i64; 1],
    strides: [i64; 1],
    view: View,
}

/// Frees an export: the deleter the tensor carries.
unsafe extern "C" fn delete(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: every tensor carrying this deleter is the `managed` field at
    // the start of a `Box<Export>` that `export` leaked, and the DLPack
    // contract calls the deleter once (the capsule's destructor calls it
    // only while no consumer has taken the tensor).
    drop(unsafe { Box::from_raw(managed.cast::<Export>()) });
}

/// The capsule's destructor: frees a tensor no consumer took.
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule being destroyed and the
    // GIL held. IsValid sets no exception; GetPointer with the name IsValid
    // just accepted cannot fail.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// A capsule holding the bytes `view` counts, as a one-dimensional,
/// read-only `uint8` CPU tensor.
pub(crate) fn export(py: Python<'_>, view: View) -> PyResult<Bound<'_, PyAny>> {
    let (data, size) = (view.held().data(), view.held().size());
    let mut export = Box::new(Export {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete),
            flags: FLAG_READ_ONLY,
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device: DLDevice {
                    device_type: CPU_DEVICE.0,
                    device_id: CPU_DEVICE.1,
                },
                ndim: 1,
                dtype: DLDataType {
                    code: K_DL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: [size as i64],
        strides: [1],
        view,
    });
    // The box's heap address never moves: these stay valid until `delete`.
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a live, leaked Export; the capsule owns it from here
    // (its destructor frees it unless a consumer took it). A failed
    // PyCapsule_New returns NULL with an exception set and owns nothing, so
    // the export is freed here.
    unsafe {
        (*raw).managed.manager_ctx = raw.cast::<c_void>();
        let capsule = ffi::PyCapsule_New(
            raw.cast::<c_void>(),
            CAPSULE_NAME.as_ptr(),
            Some(destroy_capsule),
        );
        if capsule.is_null() {
            drop(Box::from_raw(raw));
        }
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}
