# Fan-out, fan-in and round_robin with fewer producers than consumers.
#
# One source feeds two branches (each edge gets every item); the branches
# join again on one sink input. The "wide" edge has 2 producers and 4
# consumers: consumer c is fed by producer c mod 2, and each producer
# rotates its items over its two consumers.

pipeline "fan" {
  description = "fan-out, fan-in, and round_robin with P < C"
}

stage "source" {
  node     = "synthetic_source"
  replicas = 2
  config {
    count        = 200
    service_time = "uniform(1ms, 3ms)"
  }
}

stage "narrow" {
  node = "synthetic_work"
  config {
    service_time = "2ms"
  }
}

stage "wide" {
  node     = "synthetic_work"
  replicas = 4
  config {
    service_time = "exponential(6ms)"
    speed        = [1, 1, 1, 0.5] # replica 3 is a slower device
  }
}

stage "sink" {
  node = "sink"
}

edge "to_narrow" {
  from = source.out
  to   = narrow.in
}

edge "to_wide" {
  from     = source.out
  to       = wide.in
  policy   = "round_robin"
  capacity = 4
}

edge "narrow_done" {
  from = narrow.out
  to   = sink.in
}

edge "wide_done" {
  from = wide.out
  to   = sink.in
}
