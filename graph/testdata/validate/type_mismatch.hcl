stage "reader" {
  node = "synthetic_source"
  config {
    count = 10
    type  = "tokens"
  }
}

stage "pass" {
  node = "synthetic_work"
}

stage "drafter" {
  node = "typed_sink"
  config {
    type = "hidden_states"
  }
}

stage "direct" {
  node = "typed_sink"
  config {
    type = "hidden_states"
  }
}

edge "a" {
  from = reader.out
  to   = pass.in
}

# pass.out carries what pass.in receives: tokens.
edge "b" {
  from = pass.out
  to   = drafter.in
}

edge "c" {
  from = reader.out
  to   = direct.in
}
