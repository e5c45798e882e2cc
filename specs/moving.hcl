# A bottleneck that moves: the seed's shape on synthetic nodes, every edge
# shared, whose costs change halfway (from the stage's 500th item, as
# longer sequences would make them). The targets bound the first half
# (5 targets of 50ms against 3 drafters of 25ms: 100 items/s against 120),
# the drafters the second (60ms: 3 of them do 50 items/s): no split of the
# 8 replicas is best throughout. The rebalance block moves replicas
# between the two stages as the bottleneck moves:
#
#   dflow run specs/moving.hcl
#   dflow sim specs/moving.hcl                      # the same, simulated
#   dflow sim specs/moving.hcl --split target,drafter=8
#   dflow run specs/moving.hcl --rebalance=false    # the split as written

pipeline "moving" {
  description = "a bottleneck that moves halfway: targets first, drafters after"
}

variable "items" {
  default = 1000
}

stage "reader" {
  node = "synthetic_source"
  config {
    count      = var.items
    size_bytes = 1024
    type       = "tokens"
  }
}

stage "target" {
  node     = "synthetic_work"
  replicas = 5
  config {
    service_time         = "lognormal(50ms, 0.1)"
    changed_service_time = "lognormal(20ms, 0.1)"
    change_after         = var.items / 2
  }
}

stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time         = "25ms"
    changed_service_time = "60ms"
    change_after         = var.items / 2
  }
}

stage "done" {
  node = "sink"
}

edge "tokens" {
  from     = reader.out
  to       = target.in
  capacity = 16
}

edge "hs" {
  from     = target.out
  to       = drafter.in
  capacity = 8
}

edge "trained" {
  from = drafter.out
  to   = done.in
}

rebalance {
  stages = ["target", "drafter"]
  every  = "2s"
  hold   = "10s"
}
