# Packer (HCL2): bake gpufleet-agent into an AMI. Merge the variables and the build block into your
# template; source.amazon-ebs.gpu stands for your own source block.
#
# The agent is installed and enabled but not started, so that it starts on the first boot of every
# instance and nothing from the build instance (spool, host identity) is baked into the image. Instances
# get their server URL and token at launch, e.g. from user data writing /etc/gpufleet/agent.env (see
# cloud-init.yaml, without its install steps). Until the file has them the service keeps failing and is
# restarted every 5 seconds.
#
# The build instance may be a GPU instance (same family as the fleet, which lets the build prove that the
# driver and NVML work in the image) or a cheaper one without a GPU: the NVML check runs only where
# nvidia-smi sees a GPU.

variable "gpufleet_package" {
  type        = string
  default     = "gpufleet==0.1.0"
  description = "pip requirement for the agent: a pinned version, or the URL of a wheel in your artifact store."
}

variable "gpufleet_python" {
  type        = string
  default     = "python3"
  description = "Python 3.11 or later in the image (python3.11 on Amazon Linux 2023)."
}

build {
  sources = ["source.amazon-ebs.gpu"]

  provisioner "shell" {
    environment_vars = [
      "GPUFLEET_PACKAGE=${var.gpufleet_package}",
      "GPUFLEET_PYTHON=${var.gpufleet_python}",
    ]
    execute_command = "chmod +x {{ .Path }}; sudo env {{ .Vars }} bash {{ .Path }}"
    inline = [
      "set -euo pipefail",
      "\"$GPUFLEET_PYTHON\" -m venv /opt/gpufleet-agent",
      "/opt/gpufleet-agent/bin/pip install --quiet \"$GPUFLEET_PACKAGE\"",
      "/opt/gpufleet-agent/bin/gpufleet-agent install",
      "if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then",
      "  state=$(mktemp -d)",
      "  GPUFLEET_AGENT_STATE_DIR=\"$state\" /opt/gpufleet-agent/bin/gpufleet-agent once",
      "  rm -rf \"$state\"",
      "else",
      "  echo 'no GPU on the build instance: gpufleet-agent once skipped'",
      "fi",
      "rm -rf /var/lib/gpufleet-agent",
    ]
  }
}
