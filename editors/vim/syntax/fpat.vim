" Vim syntax file for fpat's pattern language (.fpat).
" Install: copy editors/vim/{syntax,ftdetect} into ~/.vim/ (or a plugin manager's directory).
" The keyword lists are checked against grammar/Fpat.g4 and patterns/fpat.fpat by fpat's test
" suite (test_editors), so they follow the language.
if exists("b:current_syntax")
  finish
endif

syntax keyword fpatInclude include
syntax keyword fpatKeyword class def defm defvar multiclass let in expr
syntax keyword fpatType list int float string bit bits dag code
syntax keyword fpatBoolean true false
syntax keyword fpatOp gemm bias_add add mul layernorm rmsnorm activation bias residual scale dtype divisible
syntax keyword fpatOp sub div pow reduce_mean softmax attn_qk attn_pv attention rank slice concat rope half_slice rope_pairs weight b_layout
syntax keyword fpatMath exp log tanh erf sqrt rsqrt abs min max pow
syntax match fpatBinding "\$[A-Za-z_][A-Za-z0-9_]*"
syntax match fpatClassName "\<[A-Z][A-Za-z0-9_]*\>"
syntax match fpatNumber "\<[0-9]\+\(\.[0-9]*\)\=\([eE][-+]\=[0-9]\+\)\=\>"
syntax region fpatString start=+"+ skip=+\\.+ end=+"+
syntax match fpatComment "//.*$"
syntax region fpatComment start="/\*" end="\*/"

highlight default link fpatInclude Include
highlight default link fpatKeyword Keyword
highlight default link fpatType Type
highlight default link fpatBoolean Boolean
highlight default link fpatOp Function
highlight default link fpatMath Function
highlight default link fpatBinding Identifier
highlight default link fpatClassName Structure
highlight default link fpatNumber Number
highlight default link fpatString String
highlight default link fpatComment Comment

let b:current_syntax = "fpat"
