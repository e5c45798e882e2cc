# A key_hash edge routes each item by its key: from a source whose items
# carry none (keys = 0, written or by default) the run would fail at its
# first item, so validate says so at the edge's policy.
stage "events" {
  node = "synthetic_source"
  config {
    count = 100
    keys  = 0
  }
}

stage "unset" {
  node = "synthetic_source"
  config {
    count = 100
  }
}

stage "keyed" {
  node = "synthetic_source"
  config {
    count = 100
    keys  = 8
  }
}

stage "shard" {
  node     = "synthetic_work"
  replicas = 3
}

edge "by_key" {
  from   = events.out
  to     = shard.in
  policy = "key_hash"
}

edge "also_by_key" {
  from   = unset.out
  to     = shard.in
  policy = "key_hash"
}

edge "fine" {
  from   = keyed.out
  to     = shard.in
  policy = "key_hash"
}

stage "done" {
  node = "sink"
}

edge "out" {
  from = shard.out
  to   = done.in
}
