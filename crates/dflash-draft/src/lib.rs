//! # dflash-draft
//!
//! DFlash draft packages for onebit. A DFlash draft drafts a whole block of tokens in
//! one forward pass, conditioned on feature rows tapped from the target's layers. Its
//! NPU package is a directory: `config.json` (geometry, `block_size`, `mask_token_id`,
//! `target_layer_ids`, ...), `dflash_weight.q4nx` (q4_1 tiles for the projections,
//! BF16 norms, the BF16 fusion matrix in `[hidden/32, taps*hidden, 32]` order, six
//! scalars) and `MANIFEST.sha256`.
//!
//! [`load_draft`] checks all of it — every projection exactly the q4_1 tile grid of its
//! N x K, every norm and the fusion matrix in the declared dtype and shape, the
//! container's scalars equal to the config, no tensor left unexplained, the manifest —
//! and returns a [`DraftModel`] of views into the mapped file. Nothing is decoded at
//! load; [`DraftModel::decode_projection`], [`DraftModel::decode_gain`] and
//! [`DraftModel::decode_fusion`] (row-major) decode one tensor at a time. Every
//! refusal is a [`DraftError`] whose message starts `dflash draft: ` and names the
//! path, key, tensor and value.
//!
//! [`draft_forward`] / [`draft_forward_cached`] run the draft (context fusion, a
//! [`DraftKvCache`] of committed positions, the non-causal block pass) on the target
//! runtime's kernels: the `q8` integer family by default, the `f32` family as the
//! reference ([`DraftPrecision`]).
//!
//! [`import_zlab`] turns a z-lab (Hugging Face) DFlash draft into a package;
//! [`synthetic`] makes formula-defined packages for tests and fixtures.
//!
//! ```
//! use dflash_draft::{load_draft, synthetic, Projection};
//!
//! let dir = tempfile::tempdir()?;
//! synthetic::write_synthetic(dir.path(), &synthetic::small_config(), 7)?;
//! let draft = load_draft(dir.path())?;
//! let q = draft.decode_projection(0, Projection::Q)?;
//! assert_eq!(q[5], synthetic::projection_value(7, 0, Projection::Q, 0, 5));
//! println!("{}", draft.inventory_line());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod config;
mod error;
mod forward;
mod import;
mod orientation;
mod package;
pub mod synthetic;
mod v2;

pub use builder::PackageBuilder;
pub use config::{
    Dflash2, DraftConfig, ScalarKind, ARCHITECTURE, ARCHITECTURE_V2, DEFAULT_WEIGHTS, SCALARS,
};
pub use error::{DraftError, Result};
pub use forward::{
    draft_block, draft_forward, draft_forward_cached, fuse_context, DraftHooks, DraftKvCache,
    DraftOutput, DraftPrecision, DraftWeights,
};
pub use import::{import_zlab, ImportReport};
pub use orientation::{fusion_orientation, Orientation};
pub use package::{
    load_draft, load_draft_with, verify_manifest, DraftModel, Gain, LoadOptions, Projection,
    TargetShape, FUSION, MANIFEST,
};
pub use v2::{Selection, Sublayer, V2Tensor};
