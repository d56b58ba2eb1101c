/* ggml's CPU matrix product (ggml_mul_mat: F16 / BF16 weights, float32 activations, which ggml rounds to the
 * weight's type first) at one thread, timed in process CPU time so that a shared machine's other processes do not
 * count, best of REPS. Built and run by tests/bench/bench_gemm_vs_ggml.py against the static ggml libraries of the
 * llama.cpp oracle build; figures only.
 *   gemm_vs_ggml ROWS K N REPS */
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double cpu(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int rows=atoi(argv[1]),k=atoi(argv[2]),n=atoi(argv[3]),reps=atoi(argv[4]);
  enum ggml_type types[2]={GGML_TYPE_F16,GGML_TYPE_BF16}; const char*names[2]={"F16","BF16"};
  for(int ti=0;ti<2;++ti){
    struct ggml_init_params ip={(size_t)1<<30,NULL,false};
    struct ggml_context*ctx=ggml_init(ip);
    struct ggml_tensor*a=ggml_new_tensor_2d(ctx,types[ti],k,rows);
    struct ggml_tensor*b=ggml_new_tensor_2d(ctx,GGML_TYPE_F32,k,n);
    float*tmp=malloc(sizeof(float)*(size_t)k*rows);
    for(size_t i=0;i<(size_t)k*rows;++i) tmp[i]=(float)(rand()%2001-1000)*5e-5f;
    if(ti==0) ggml_fp32_to_fp16_row(tmp,a->data,(int64_t)k*rows); else ggml_fp32_to_bf16_row(tmp,a->data,(int64_t)k*rows);
    for(size_t i=0;i<(size_t)k*n;++i) ((float*)b->data)[i]=(float)(rand()%2001-1000)*1e-3f;
    struct ggml_tensor*c=ggml_mul_mat(ctx,a,b);
    struct ggml_cgraph*gf=ggml_new_graph(ctx); ggml_build_forward_expand(gf,c);
    ggml_graph_compute_with_ctx(ctx,gf,1);
    double best=1e9; for(int r=0;r<reps;++r){double t=cpu(); ggml_graph_compute_with_ctx(ctx,gf,1); t=cpu()-t; if(t<best)best=t;}
    printf("ggml %s %d %d %d gemm %.1f GFLOP/s 1 thread (CPU time)\n",names[ti],rows,k,n,2.0*rows*k*n/best/1e9);
    free(tmp); ggml_free(ctx);
  }
}
