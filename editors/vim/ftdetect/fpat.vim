" fpat's file types: .fpat patterns and .fgraph graphs.
autocmd BufRead,BufNewFile *.fpat setfiletype fpat
autocmd BufRead,BufNewFile *.fgraph setfiletype fgraph
