# safe-llama for interactive shells: source this from ~/.bashrc or ~/.zshrc.
#   . /path/to/safe-llama/configs/shell/safe-llama.sh
# llama-cli, llama-server and llama-completion then start through safe-llama (a plan that fits the
# device; one line per change). `command llama-server` or `\llama-server` runs whatever llama-server is on
# PATH instead: after scripts/setup.sh there is none (the real one is the pinned build that
# `safe-llama doctor` shows); for links that work in scripts too, see `safe-llama install-shims`.
alias llama-cli='safe-llama-cli'
alias llama-server='safe-llama-server'
alias llama-completion='safe-llama-completion'

# Tab completion of safe-llama's own commands and options (Typer's completion scripts).
if [ -n "${BASH_VERSION:-}" ]; then
  eval "$(safe-llama --show-completion bash 2>/dev/null)"
elif [ -n "${ZSH_VERSION:-}" ]; then
  eval "$(safe-llama --show-completion zsh 2>/dev/null)"
fi
