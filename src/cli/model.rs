//! `treegrpo model …`: fetch the default model, describe a model.

use std::path::PathBuf;

use clap::Subcommand;
use treegrpo::model::fetch;

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into $TREEGRPO_HOME.
    Fetch {
        /// Download again even if a verified copy exists.
        #[arg(long)]
        force: bool,
    },
    /// Print a model's configuration as JSON.
    Info {
        /// A .gguf file or an HF directory (default: the default model).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Fetch { force } => {
            let mut progress = |msg: &str| eprintln!("{msg}");
            let path = if force {
                fetch::fetch_default_model(&mut progress)?
            } else {
                fetch::ensure_default_model(&mut progress)?
            };
            println!("{}", path.display());
        }
        ModelCommand::Info { model } => {
            let m = super::load_model(model.as_deref())?;
            let info = serde_json::json!({
                "source": m.source,
                "config": m.model.config(),
                "tokenizer_vocab": m.tokenizer.vocab_size(),
                "bos": m.tokenizer.bos(),
                "stop_tokens": m.tokenizer.eos_ids(),
                "has_chat_template": m.chat_template.is_some(),
                "kv_bytes_per_token": m.model.config().kv_bytes_per_token(),
            });
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
    }
    Ok(())
}
