//! Property test: any vault the writer makes, from blobs given in any
//! order, reopens through `Vault::open` with every entry, every payload
//! byte, zero padding and the metadata exactly as written.

use std::collections::BTreeMap;

use proptest::prelude::*;
use smoe::vault::{Vault, VaultWriter, WriterOptions};

#[derive(Debug, Clone)]
struct Case {
    n_layers: u32,
    n_experts: u32,
    /// (layer, expert) → payload, in the order they are added.
    blobs: Vec<((u32, u32), Vec<u8>)>,
    alignment: u32,
    checksums: bool,
    meta: Option<String>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..6, 1u32..9)
        .prop_flat_map(|(n_layers, n_experts)| {
            let ids = (n_layers * n_experts) as usize;
            (
                Just(n_layers),
                Just(n_experts),
                // A non-empty subset of the ids, each with a size and a fill seed.
                proptest::sample::subsequence((0..ids).collect::<Vec<_>>(), 1..=ids),
                proptest::collection::vec((1usize..40_000, any::<u64>()), ids),
                prop_oneof![Just(4096u32), Just(16384), Just(65536)],
                any::<bool>(),
                proptest::option::of("[a-z0-9 _]{0,40}"),
            )
        })
        .prop_flat_map(
            |(n_layers, n_experts, ids, sizes, alignment, checksums, meta)| {
                let blobs: Vec<((u32, u32), Vec<u8>)> = ids
                    .iter()
                    .map(|&id| {
                        let (size, seed) = sizes[id];
                        let mut x = seed | 1;
                        let data = (0..size)
                            .map(|_| {
                                // xorshift64: cheap, full-entropy bytes.
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                x as u8
                            })
                            .collect();
                        ((id as u32 / n_experts, id as u32 % n_experts), data)
                    })
                    .collect();
                let meta = meta.map(|text| {
                    serde_json::json!({ "format": "smoe-vault", "note": text, "top_k": 8 })
                        .to_string()
                });
                (
                    Just(blobs).prop_shuffle(),
                    Just((n_layers, n_experts, alignment, checksums, meta)),
                )
            },
        )
        .prop_map(
            |(blobs, (n_layers, n_experts, alignment, checksums, meta))| Case {
                n_layers,
                n_experts,
                blobs,
                alignment,
                checksums,
                meta,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn written_vaults_read_back_exactly(case in case()) {
        let dir = tempfile::tempdir().unwrap();
        let opts = WriterOptions {
            alignment: case.alignment,
            checksums: case.checksums,
            meta: case.meta.clone(),
            vault_id: None,
        };
        let mut w = VaultWriter::create(dir.path(), case.n_layers, case.n_experts, opts).unwrap();
        for ((layer, expert), data) in &case.blobs {
            w.add_blob(*layer, *expert, data).unwrap();
        }
        let path = w.finish().unwrap();

        // Open through the directory, as a host would.
        let vault = Vault::open(dir.path()).unwrap();
        let file = std::fs::read(&path).unwrap();
        let h = vault.header();
        prop_assert_eq!(h.n_layers, case.n_layers);
        prop_assert_eq!(h.n_experts, case.n_experts);
        prop_assert_eq!(h.alignment, case.alignment);
        prop_assert_eq!(h.has_checksums(), case.checksums);
        prop_assert_eq!(h.file_bytes, file.len() as u64);
        prop_assert_eq!(vault.meta(), case.meta.as_deref().unwrap_or(""));

        let want: BTreeMap<(u32, u32), &Vec<u8>> =
            case.blobs.iter().map(|(k, v)| (*k, v)).collect();
        prop_assert_eq!(vault.entries().len(), want.len());
        // Entries come sorted by (layer, expert), as the BTreeMap iterates.
        for (e, (&(layer, expert), data)) in vault.entries().iter().zip(&want) {
            prop_assert_eq!((e.layer, e.expert), (layer, expert));
            prop_assert_eq!(vault.entry(layer, expert), Some(e));
            prop_assert_eq!(e.size, data.len() as u64);
            prop_assert_eq!(e.padded_size, e.size.next_multiple_of(u64::from(case.alignment)));
            prop_assert_eq!(e.offset % u64::from(case.alignment), 0);
            let start = e.offset as usize;
            let end = start + e.size as usize;
            prop_assert!(&file[start..end] == data.as_slice(), "payload of {layer}/{expert} differs");
            prop_assert!(file[end..start + e.padded_size as usize].iter().all(|&b| b == 0));
            let xxh3 = if case.checksums { xxhash_rust::xxh3::xxh3_64(data) } else { 0 };
            prop_assert_eq!(e.xxh3, xxh3);
        }
        for layer in 0..case.n_layers + 1 {
            for expert in 0..case.n_experts + 1 {
                if !want.contains_key(&(layer, expert)) {
                    prop_assert!(vault.entry(layer, expert).is_none());
                }
            }
        }
        prop_assert_eq!(
            vault.total_payload_bytes(),
            want.values().map(|d| d.len() as u64).sum::<u64>()
        );
        prop_assert_eq!(
            vault.max_padded_size(),
            vault.entries().iter().map(|e| e.padded_size).max().unwrap()
        );
    }
}
