//! Host-side checks of the NVMe driver's public entry points that need no device.
use lavik::nvme::{NvmeBlockDevice, NvmeOptions, SpdkUri};

// Proves opening a PCI address that is not a vfio-bound NVMe controller fails with an
// error naming the problem instead of panicking or hanging.
#[test]
fn open_without_vfio_device_is_an_error() {
    let uri: SpdkUri = "spdk://0000:ff:1f.7/1".parse().expect("valid uri");
    let err = NvmeBlockDevice::open(uri, NvmeOptions::default())
        .err()
        .expect("no such device here");
    let msg = err.to_string();
    assert!(msg.starts_with("VFIO:"), "unexpected error: {msg}");
}
