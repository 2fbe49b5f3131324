" Vim syntax file for fpat's graph text form (.fgraph).
" The keyword lists are checked against grammar/FGraph.g4 and the IR's op registry by fpat's
" test suite (test_editors).
if exists("b:current_syntax")
  finish
endif

syntax keyword fgraphKeyword graph output
syntax keyword fgraphBoolean true false
syntax keyword fgraphOp input weight gemm bias_add activation add mul layernorm rmsnorm fused
syntax keyword fgraphOp constant sub div pow reduce_mean softmax slice attn_qk attn_pv attention heads merge_heads concat rope max min batch_first seq_first kv_append
syntax keyword fgraphType f16 bf16 f32
syntax match fgraphValue "%[A-Za-z0-9_.]\+"
syntax match fgraphNumber "-\=\<[0-9]\+\(\.[0-9]*\)\=\([eE][-+]\=[0-9]\+\)\=\>"
syntax region fgraphString start=+"+ skip=+\\.+ end=+"+
syntax match fgraphComment "//.*$"

highlight default link fgraphKeyword Keyword
highlight default link fgraphBoolean Boolean
highlight default link fgraphOp Function
highlight default link fgraphType Type
highlight default link fgraphValue Identifier
highlight default link fgraphNumber Number
highlight default link fgraphString String
highlight default link fgraphComment Comment

let b:current_syntax = "fgraph"
