// The step's sequences as the Mamba kernels see them; compiled in front of ssm/conv1d.cu and
// ssm/scan.cu. A snapshot tap (position q, slot s) stores the state after q tokens of its sequence
// into snapshot slot s.

struct SsmSeqs {
    const int* seq_starts;  // device [num_seqs + 1], token offsets in the step
    const int* positions;   // device [num_tokens]
    const int* live_slots;  // device [num_seqs]
    const int* tap_starts;  // device [num_seqs + 1], offsets into taps
    const int* taps;        // device [num_taps, 2] (position, snapshot slot)
};
