# MLX staging, call 1 of 2 (device-recipes.md): carry [".devmlx1", ".device"]; copies part 1 of the mlx-cuda-13 wheel and the mlx, mlx-lm wheels out of the checkout
S=/tmp/S; mkdir -p $S && cp .devmlx1/*.whl .devmlx1/part.aa $S/ && ls -la $S
