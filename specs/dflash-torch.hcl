# The DFlash job in PyTorch: the main job's graph (specs/dflash.hcl) with
# its 5 target replicas and its 3 drafter replicas written in PyTorch
# (plugins/examples/torch): the drafters are the three ranks of one DDP
# job (gloo on the CPU, NCCL on CUDA devices), stepping together, and
# their checkpoint is the Go drafter's layout, which dflow eval reads.
# It takes the main job's variables, so the same overrides work on both:
#   dflow run specs/dflash-torch.hcl --var batches=2400 --var checkpoint=drafter-ddp-full.safetensors
#   dflow eval drafter-ddp.safetensors

plugin "torch" {
  path = "../plugins/examples/torch/dflow-plugin-torch"
}

pipeline "dflash_torch" {
  description = "5 PyTorch target replicas feed 3 DDP drafter ranks"
}

variable "targets" {
  default = 5
}

variable "corpus" {
  default = "$GOROOT/src" # a file, folder or glob of text
}

variable "batches" {
  default = 240 # a tenth of the main job's: PyTorch on a CPU (--var batches=2400 for all of it)
}

variable "checkpoint" {
  default = "drafter-ddp.safetensors"
}

variable "device" {
  default = "cpu" # every stage's device: "cuda:0" puts the targets and the ranks on one GPU
}

stage "reader" {
  node = "text_reader"
  config {
    path       = var.corpus
    seq_len    = 64
    batch_size = 8
    limit      = var.batches
    max_bytes  = 16777216
  }
}

stage "target" {
  node     = "torch/target_forward"
  replicas = var.targets
  devices  = [var.device]
  config {
    model   = "models/target.safetensors"
    threads = 1 # a torch thread per replica: five on a few cores
  }
}

stage "drafter" {
  node     = "torch/drafter_train"
  replicas = 3 # the DDP ranks
  devices  = [var.device]
  config {
    target     = "models/target.safetensors"
    block_size = 4
    checkpoint = var.checkpoint
    threads    = 1
  }
}

edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "shared"
  capacity = 16
}

edge "hs" {
  from     = target.hidden
  to       = drafter.hidden
  policy   = "shared" # the ranks take batches as they step; a rank with none gets an empty step
  capacity = 8
}
