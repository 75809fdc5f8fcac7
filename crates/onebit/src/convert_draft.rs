//! `onebit convert-draft ZLAB_DIR OUT_DIR [--target TARGET_DIR]`: a z-lab DFlash (or
//! DFlash 2) draft to an NPU draft package.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use dflash_draft::{import_zlab, TargetShape};
use npu_runtime::TargetPackage;

#[derive(Args)]
pub struct ConvertDraftArgs {
    /// The z-lab draft directory (config.json with dflash_config, model.safetensors).
    pub zlab_dir: PathBuf,
    /// The package directory to write.
    pub out_dir: PathBuf,
    /// A target package to pair with: checks tap layers and the mask token against it.
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Replace an existing package in OUT_DIR.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &ConvertDraftArgs) -> Result<()> {
    let start = Instant::now();
    if args.out_dir.join(dflash_draft::DEFAULT_WEIGHTS).exists() && !args.force {
        bail!(
            "convert-draft: {}: a package is already there (pass --force to replace it)",
            args.out_dir.display()
        );
    }
    let target = match &args.target {
        Some(dir) => {
            let p = TargetPackage::open(dir)?;
            Some(TargetShape {
                name: dir.display().to_string(),
                num_layers: p.config.num_layers,
                hidden_size: p.config.hidden_size,
                vocab_size: p.config.vocab_size,
            })
        }
        None => None,
    };
    let report = import_zlab(&args.zlab_dir, &args.out_dir, target.as_ref())?;
    println!("draft package: {}", report.inventory);
    println!(
        "largest change: projections {:e}, norms {:e}, fusion {:e} (BF16)",
        report.max_projection_error, report.max_gain_error, report.max_fusion_error
    );
    if report.inventory.contains("DFlash 2") {
        println!(
            "largest change: DFlash 2 convolutions and selector {:e} (BF16)",
            report.max_v2_error
        );
    }
    println!(
        "converted {} in {:.2} s -> {}",
        args.zlab_dir.display(),
        start.elapsed().as_secs_f64(),
        args.out_dir.display()
    );
    Ok(())
}
