"""The embedding map's parts that need no model: the PCA projection (against scikit-learn's), the rows a
capped map keeps, the colour groups of the legend, TSV cells, and the command's choices."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.cli import map_commands
from bertforge.errors import InputError
from bertforge.retrieval import embedding_map
from bertforge.retrieval.embedding_map import colour_groups, pca_2d, sample_rows, tsv_cell


def test_embedding_map_pca_equals_scikit_learn_up_to_sign_and_is_deterministic():
    decomposition = pytest.importorskip("sklearn.decomposition")
    vectors = np.random.default_rng(0).normal(size=(60, 12)).astype(np.float32)
    vectors[:, 0] *= 5  # a dominant direction
    points, explained = pca_2d(vectors)
    reference = decomposition.PCA(n_components=2, svd_solver="full").fit(vectors.astype(np.float64))
    expected = reference.transform(vectors.astype(np.float64))
    signs = np.sign((points * expected).sum(axis=0))
    assert np.allclose(points, expected * signs, atol=1e-4)
    assert explained == pytest.approx(tuple(reference.explained_variance_ratio_), abs=1e-9)
    # The sign rule: the same map for the rows in another order, and for the vectors negated.
    order = np.random.default_rng(1).permutation(60)
    assert np.allclose(pca_2d(vectors[order])[0], points[order], atol=1e-4)
    assert np.allclose(pca_2d(-vectors)[0], points, atol=1e-4) or np.allclose(pca_2d(-vectors)[0], -points, atol=1e-4)


def test_embedding_map_pca_of_one_dimension_has_a_flat_second_axis():
    points, explained = pca_2d(np.array([[1.0], [2.0], [4.0]], np.float32))
    assert points.shape == (3, 2) and np.all(points[:, 1] == 0) and explained == (pytest.approx(1.0), 0.0)


def test_embedding_map_sample_rows_keeps_all_or_a_seeded_sorted_subset():
    assert sample_rows(5, 10, 0).tolist() == [0, 1, 2, 3, 4]
    rows = sample_rows(1000, 50, seed=3)
    assert len(rows) == len(set(rows.tolist())) == 50 and rows.tolist() == sorted(rows.tolist())
    assert rows.tolist() == sample_rows(1000, 50, seed=3).tolist() != sample_rows(1000, 50, seed=4).tolist()
    with pytest.raises(InputError, match="max_points must be an integer of at least 2"):
        sample_rows(10, 1, 0)


def test_embedding_map_colour_groups_name_the_frequent_labels_and_pool_the_rest():
    assert colour_groups(None) == [("", None)]
    few = colour_groups(["b", "a", "b"])
    assert [name for name, _ in few] == ["b (2)", "a (1)"] and few[0][1].tolist() == [True, False, True]
    many = [f"label{i}" for i in range(25) for _ in range(25 - i)]  # label0 most frequent
    groups = colour_groups(many)
    assert len(groups) == embedding_map.MAX_COLOURS + 1
    assert groups[0][0] == "label0 (25)"
    name, mask = groups[-1]
    assert name == f"other: {25 - embedding_map.MAX_COLOURS} labels ({int(mask.sum())})"
    assert sum(int(m.sum()) for _, m in groups) == len(many)


def test_embedding_map_tsv_cell_keeps_one_line_one_cell():
    assert tsv_cell("a\tb\nc\r\nd  e") == "a b c d e"
    assert tsv_cell("") == " "  # an empty cell would shift TensorBoard's columns


def test_embedding_map_command_choices_are_the_modules():
    assert map_commands.METHOD_CHOICES == embedding_map.METHODS
    assert map_commands.DEFAULT_MAX_POINTS == embedding_map.DEFAULT_MAX_POINTS
