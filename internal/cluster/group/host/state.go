package host

// State is where a group stands, for tests of the coordinator's side of a
// loss that start from a given state rather than play the rounds to it.
type State struct {
	Saves     bool     // a member said the group saves
	Durable   uint32   // the round its last save holds
	SaveStep  int      // that save's step
	Round     uint32   // the round completed last
	LastRound []uint32 // the round each member completed last
	Share     []string // the share each member asked from last
	Left      []int    // the members that have left
}

// SetState puts h where s says.
func (h *Host) SetState(s State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.saves, h.durable, h.saveStep, h.round = s.Saves, s.Durable, s.SaveStep, s.Round
	h.lastRound = s.LastRound
	h.share = s.Share
	for _, i := range s.Left {
		if !h.left[i] {
			h.left[i] = true
			h.members--
		}
	}
}

// ShareOf is the share member i asked from last ("": none yet).
func (h *Host) ShareOf(i int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.share[i]
}
